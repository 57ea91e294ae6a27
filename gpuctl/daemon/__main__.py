"""``python -m gpuctl.daemon``: the same as the ``gpuctld`` command."""

from gpuctl.daemon.main import main

raise SystemExit(main())
