"""A tiny reader for classic pcap files of Ethernet/IPv4/UDP traffic (gzip or plain).

Enough for test fixtures: it yields every UDP datagram with its 1-based frame number (the
numbering tshark uses), timestamp and addresses, and raises ValueError on anything it does not
understand rather than guessing (pcapng, another link type, IP fragments, truncated records).
Non-UDP packets are skipped.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LINKTYPE_ETHERNET = 1
ETHERTYPE_IPV4 = 0x0800
ETHERTYPE_VLAN = 0x8100
IPPROTO_UDP = 17

_MAGIC_US = 0xA1B2C3D4
_MAGIC_NS = 0xA1B23C4D
_ETH = struct.Struct("!6s6sH")
_IPV4 = struct.Struct("!BBHHHBBH4s4s")
_UDP = struct.Struct("!HHHH")


@dataclass(frozen=True, slots=True)
class UdpDatagram:
    """One captured UDP datagram: ``number`` counts every record in the file from 1."""

    number: int
    timestamp: float
    src: str
    src_port: int
    dst: str
    dst_port: int
    payload: bytes


def _ip(raw: bytes) -> str:
    return ".".join(str(b) for b in raw)


def read_udp(path: Path) -> Iterator[UdpDatagram]:
    """Yield the UDP datagrams of a classic pcap file (``.gz`` is decompressed)."""
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if len(data) < 24:
        raise ValueError("not a pcap file: shorter than its global header")
    for order in ("<", ">"):
        (magic,) = struct.unpack_from(order + "I", data, 0)
        if magic in (_MAGIC_US, _MAGIC_NS):
            break
    else:
        raise ValueError("not a classic pcap file (pcapng is not supported)")
    scale = 1e-6 if magic == _MAGIC_US else 1e-9
    _vmaj, _vmin, _zone, _sigfigs, _snaplen, linktype = struct.unpack_from(
        order + "HHiIII", data, 4
    )
    if linktype != LINKTYPE_ETHERNET:
        raise ValueError(f"unsupported link type {linktype}")
    record = struct.Struct(order + "IIII")
    offset = 24
    number = 0
    while offset < len(data):
        if len(data) - offset < record.size:
            raise ValueError(f"truncated record header at byte {offset}")
        ts_sec, ts_frac, incl_len, orig_len = record.unpack_from(data, offset)
        offset += record.size
        packet = data[offset : offset + incl_len]
        offset += incl_len
        number += 1
        if len(packet) != incl_len or incl_len != orig_len:
            raise ValueError(f"packet {number} is truncated")
        datagram = _parse_ethernet(packet, number, ts_sec + ts_frac * scale)
        if datagram is not None:
            yield datagram


def _parse_ethernet(packet: bytes, number: int, timestamp: float) -> UdpDatagram | None:
    _dst_mac, _src_mac, ethertype = _ETH.unpack_from(packet, 0)
    pos = _ETH.size
    if ethertype == ETHERTYPE_VLAN:
        (ethertype,) = struct.unpack_from("!H", packet, pos + 2)
        pos += 4
    if ethertype != ETHERTYPE_IPV4:
        return None
    (ver_ihl, _tos, total_length, _ident, frag, _ttl, proto, _csum, src, dst) = _IPV4.unpack_from(
        packet, pos
    )
    if ver_ihl >> 4 != 4:
        raise ValueError(f"packet {number}: IP version {ver_ihl >> 4}")
    if frag & 0x3FFF:
        raise ValueError(f"packet {number}: IP fragments are not supported")
    if proto != IPPROTO_UDP:
        return None
    ip_end = pos + total_length
    pos += (ver_ihl & 0x0F) * 4
    src_port, dst_port, udp_length, _udp_csum = _UDP.unpack_from(packet, pos)
    if pos + udp_length > ip_end or ip_end > len(packet):
        raise ValueError(f"packet {number}: UDP length {udp_length} runs past the packet")
    payload = packet[pos + _UDP.size : pos + udp_length]
    return UdpDatagram(number, timestamp, _ip(src), src_port, _ip(dst), dst_port, payload)
