"""Late joiners, in the client process: a subscription that reads a stream's recorded history
(:mod:`shmbus.archive`) and then its live log, with no gap and no duplicate at the hand-over.
"""
