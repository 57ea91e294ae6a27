"""Helpers shared by the test folders: a real sshd, gpuctld processes, fake NVML, fleet fixtures."""
