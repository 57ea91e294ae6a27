"""gpuctld, the node daemon: GPU backend, telemetry sampler, durable slice/lease state, control API.

Modules: ``state`` (durable node state and its operations), ``telemetry`` (sampler thread and
history ring), ``api`` (HTTP/1.1 + JSON control API on a Unix socket), ``main`` (the ``gpuctld``
command), ``bridge`` (stdin/stdout to the socket, for SSH). Never imports textual.
"""
