"""Remote-attach data path: the wire protocol, the per-lease worker process and its executors.

Modules: protocol (frames, limits, handshake), ops (allow-list), accounting (quota, counters,
stats file), executor_numpy / executor_cupy, session (one connection's handles and batches),
worker (the process), launcher (how gpuctld starts a worker). See docs/DATAPATH.md.
"""
