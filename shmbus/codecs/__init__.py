"""Message codecs: how numpy arrays, Python objects and Arrow tables become message bytes and
back, and which sources a decoder may trust.

Pure functions over buffers, called by publications and subscriptions in the client process.
They import no client module.
"""
