"""gpuctl: elastic GPU infrastructure for an organization (fleet console, CLI, node daemon, remote attach)."""

__version__ = "0.1.0"
