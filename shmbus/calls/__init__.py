"""Request/reply over the bus, in the client process: a :class:`Requester` sends calls with a
call header and a reply channel, a :class:`Responder` serves them from a worker group and
answers on the caller's channel.
"""
