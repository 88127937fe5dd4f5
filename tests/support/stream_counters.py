"""The counters a bus shows for one network stream, made by hand for the tests of what the CLI
reads from them (``shmbus streams``, ``shmbus stat``): a publication, its sender and an image
with one subscriber, as the driver and the netbridge label them."""

from __future__ import annotations

from shmbus.shm.counters import Counter

#: (type id, label, value, registration id, owner id, reference id) of a counter to number
Row = tuple[int, str, int, int, int, int]


def network_stream_counters(publication_channel: str, image_channel: str, *,
                            sender_limit: int = 8000,
                            flow_control: tuple[Row, ...] = ()) -> list[Counter]:
    """The counters, numbered from 7, of client pid 4240's publication (session -77 of
    stream 9 on ``publication_channel``: pub-lmt and pub-pos 40000, snd-pos 8000, snd-lmt
    ``sender_limit``, 3 back-pressure events), then the ``flow_control`` rows, then an image
    (session -5 on ``image_channel`` from 127.0.0.1:4000: rcv-hwm 5000, rcv-pos 4000) that
    subscriber pid 4242 ("w") has read to 3000."""
    pub, image = publication_channel, image_channel
    rows: list[Row] = [
        (11, "client-heartbeat: 3 pid=4240 pub", 1000, 3, 3, 4240),
        (1, f"pub-lmt: 5 -77 9 {pub}", 40000, 5, 3, -77),
        (12, f"pub-pos: 5 -77 9 {pub}", 40000, 5, 3, -77),
        (2, f"snd-pos: 5 -77 9 {pub}", 8000, 5, 3, -77),
        (9, f"snd-lmt: 5 -77 9 {pub}", sender_limit, 5, 3, -77),
        (13, f"snd-bpe: 5 -77 9 {pub}", 3, 5, 3, -77),
        *flow_control,
        (3, f"rcv-hwm: 20 -5 9 {image} 127.0.0.1:4000", 5000, 20, 99, -5),
        (5, f"rcv-pos: 20 -5 9 {image} 127.0.0.1:4000", 4000, 20, 99, -5),
        (4, f"sub-pos: 21 -5 9 {image} @0 pid=4242 w", 3000, 21, 30, 20),
    ]
    return [Counter(counter_id, *row, b"") for counter_id, row in enumerate(rows, start=7)]
