"""Install gpuctld on a node over SSH: the logic of `gpuctl node bootstrap` (no terminal, no argparse).

The node needs only sshd and a Python >= 3.11 (with venv/ensurepip). Steps, in order (names are
stable, for ``--json``):

- ``build-wheel`` (local, only without ``--wheel``): ``python -m pip wheel --no-deps`` on a clean
  copy of the running gpuctl's source tree.
- ``connect``: the SSH connection (the node's fleet-config SSH settings, ~/.ssh/config, known_hosts).
- ``check-python``: the node's Python is >= :data:`MIN_PYTHON` and has venv + ensurepip.
- ``check-root`` (systemd only, without sudo): the SSH account is root (writing the unit needs it).
- ``upload``: ``mktemp -d`` on the node, the wheel (and the rendered unit) copied there over SFTP.
- ``create-venv``: ``python -m venv PREFIX`` (refuses a PREFIX that exists, is not empty and is not
  a virtual environment; an existing one is updated in place).
- ``install-gpuctl``: ``PREFIX/bin/python -m pip install WHEEL`` (gpuctl and its dependencies,
  from the node's package index unless ``no_index``), then ``--no-deps --force-reinstall`` so a
  re-run with the same version still replaces the code: running bootstrap twice upgrades in place.
- ``verify``: ``PREFIX/bin/gpuctld bridge --help`` runs and the installed version is read.
- ``install-unit``, ``start-service``, ``health`` (systemd only): the unit written to
  :data:`UNIT_PATH` with ExecStart = ``PREFIX/bin/gpuctld serve --backend B ...``,
  ``systemctl daemon-reload``, ``enable``, ``restart`` (restart, not ``--now``, so an upgrade runs
  the new code; it ends the running daemon's lease workers), then ``gpuctld bridge`` is asked for
  ``GET /v1/health`` until it answers 200 or ``health_timeout_s`` passes.
- ``cleanup``: the node's temporary directory removed (also after a failure).

Every remote failure is a :class:`BootstrapError` naming the node, the step, the command, its exit
status and the tail of its stderr; ``exit_code`` is a gpuctl.exit_codes.ExitCode (UNREACHABLE for
SSH failures, CONFIG for an unusable ssh config, FAILURE for a failed step, USAGE for bad input).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from gpuctl.config import FleetConfig, NodeConfig
from gpuctl.exit_codes import ExitCode

#: Where gpuctl is installed on the node unless --prefix says otherwise.
DEFAULT_PREFIX = "/opt/gpuctl"
#: Oldest Python gpuctl runs on (pyproject.toml requires-python).
MIN_PYTHON = (3, 11)
#: The systemd unit written on the node.
UNIT_PATH = "/etc/systemd/system/gpuctld.service"
#: The unit template: deploy/gpuctld.service of the source tree, else the copy a wheel install puts
#: in <prefix>/share/gpuctl (pyproject's data-files).
_SOURCE_UNIT = Path(__file__).resolve().parents[2] / "deploy" / "gpuctld.service"
UNIT_TEMPLATE = _SOURCE_UNIT if _SOURCE_UNIT.exists() else Path(sys.prefix) / "share" / "gpuctl" / "gpuctld.service"
#: The daemon's socket when the unit's ExecStart names none (gpuctl.daemon.paths for root).
DEFAULT_UNIT_SOCKET = "/run/gpuctld/gpuctld.sock"
#: Values of --backend (gpuctld serve --backend).
BACKENDS = ("auto", "nvml", "simulated")
#: Seconds to wait for the started daemon to answer /v1/health.
HEALTH_TIMEOUT_S = 30.0
#: Seconds one remote command may run (pip install may download dependencies).
COMMAND_TIMEOUT_S = 900.0
#: SSH connect timeout, seconds, for a host that is not a node of the fleet config.
HOST_TIMEOUT_S = 10.0
#: Lines of a failed command's stderr kept in the error.
STDERR_TAIL_LINES = 12
#: Prefixes the unit's ProtectHome=yes hides from the daemon.
_HOME_DIRS = ("/home", "/root", "/run/user")
#: The HTTP request the health step sends through `gpuctld bridge`.
HEALTH_REQUEST = b"GET /v1/health HTTP/1.1\r\nHost: gpuctld\r\nConnection: close\r\n\r\n"
_PIP = "-m pip install --no-input --disable-pip-version-check"


class BootstrapError(Exception):
    """Bootstrap could not go on. ``str()`` is the whole message (node, step, command, status, stderr).

    exit_code: ExitCode. step: the step's name (None before the steps). command: the remote or
    local command that failed (None when no command did). rc: its exit status (None: none given,
    e.g. timed out). stderr_tail: the last :data:`STDERR_TAIL_LINES` lines of its stderr.
    """

    def __init__(self, message: str, exit_code: int, *, step: str | None = None, command: str | None = None,
                 rc: int | None = None, stderr_tail: str | None = None):
        super().__init__(message)
        self.message = message
        self.exit_code = ExitCode(exit_code)
        self.step = step
        self.command = command
        self.rc = rc
        self.stderr_tail = stderr_tail


@dataclass(frozen=True)
class BootstrapOptions:
    """What to install and how.

    prefix: absolute path of the virtual environment on the node. python: the node's interpreter
    that creates it (a command name or path). backend: gpuctld --backend in the unit (BACKENDS).
    systemd: write the unit, start the service and check its health. system_site_packages: the
    venv sees the node's system packages. no_index: pip never reaches a package index (the
    dependencies must already be there, e.g. with system_site_packages or find_links). find_links:
    a directory of wheels on the node that pip also looks in (pip --find-links; with no_index, an
    offline install from that wheelhouse). sudo: run the installing
    commands through ``sudo -n`` (non-root SSH account with passwordless sudo).
    health_timeout_s, command_timeout_s: seconds.
    """

    prefix: str = DEFAULT_PREFIX
    python: str = "python3"
    backend: str = "auto"
    systemd: bool = True
    system_site_packages: bool = False
    no_index: bool = False
    find_links: str | None = None
    sudo: bool = False
    health_timeout_s: float = HEALTH_TIMEOUT_S
    command_timeout_s: float = COMMAND_TIMEOUT_S

    def check(self) -> None:
        """Raise BootstrapError (USAGE) naming the flag when an option cannot be used."""
        p = self.prefix
        if not p.startswith("/"):
            raise _usage(f"--prefix {p!r}: must be an absolute path on the node")
        if p != str(PurePosixPath(p)) or ".." in PurePosixPath(p).parts or p == "/":
            raise _usage(f"--prefix {p!r}: write it plainly (no trailing '/', '..', '//'; not '/')")
        if not re.fullmatch(r"[A-Za-z0-9._+/@:-]+", p):
            raise _usage(f"--prefix {p!r}: only letters, digits and . _ + - / @ : please (it goes into "
                         "shell commands and systemd's ExecStart)")
        if self.systemd and any(p == h or p.startswith(h + "/") for h in _HOME_DIRS):
            raise _usage(f"--prefix {p}: the unit has ProtectHome=yes, so gpuctld cannot run from under "
                         f"{', '.join(_HOME_DIRS)}; choose another prefix (default {DEFAULT_PREFIX}) or --no-systemd")
        if not self.python.strip():
            raise _usage("--python: must name the node's Python (e.g. python3 or /usr/bin/python3.11)")
        if self.backend not in BACKENDS:
            raise _usage(f"--backend {self.backend!r}: one of {', '.join(BACKENDS)}")
        if self.find_links is not None and not self.find_links.startswith("/"):
            raise _usage(f"--find-links {self.find_links!r}: must be an absolute path of a directory on the node")

    @property
    def gpuctld(self) -> str:
        """Path of the installed daemon program on the node: PREFIX/bin/gpuctld."""
        return f"{self.prefix}/bin/gpuctld"


@dataclass(frozen=True)
class Target:
    """The node to bootstrap: `name` (fleet-config node name, or the host as given), `node` (what
    SshTransport reads), `from_config` (True when it is a node of the fleet config)."""

    name: str
    node: NodeConfig
    from_config: bool


def _usage(message: str) -> BootstrapError:
    return BootstrapError(message, ExitCode.USAGE)


def resolve_target(text: str, cfg: FleetConfig | None) -> Target:
    """NODE_OR_HOST as a Target: a node of `cfg` by name (its SSH settings), else a host (an
    ~/.ssh/config alias or address, ``user@`` allowed). Raises BootstrapError (USAGE) for an
    empty or option-like host or a node whose transport is not ssh."""
    node = cfg.node(text) if cfg is not None else None
    if node is not None:
        if node.transport != "ssh" or not node.host:
            raise _usage(f"node {text}: transport {node.transport!r} has no SSH host to install on "
                         f"(bootstrap needs a node reached over ssh)")
        return Target(text, node, True)
    if not text or text != text.strip() or text.startswith("-") or any(ch.isspace() for ch in text):
        raise _usage(f"NODE_OR_HOST {text!r}: not a node name of the fleet config nor a host name")
    user, _, host = text.rpartition("@")
    if not host:
        raise _usage(f"NODE_OR_HOST {text!r}: no host after '@'")
    return Target(text, NodeConfig(name=text, host=host, user=user or None, timeout_s=HOST_TIMEOUT_S), False)


# --------------------------------------------------------------------------- unit, snippet


def render_unit(template: str, *, prefix: str, backend: str) -> str:
    """The unit file text: `template` (deploy/gpuctld.service) with ExecStart's program replaced by
    PREFIX/bin/gpuctld and its ``--backend`` set to `backend`; other lines as they are.
    Raises ValueError when the template has no ExecStart line."""
    lines = template.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("ExecStart="):
            words = shlex.split(line[len("ExecStart="):])
            words[0] = f"{prefix}/bin/gpuctld"
            if "--backend" in words[:-1]:
                words[words.index("--backend") + 1] = backend
            else:
                if len(words) == 1 or words[1] != "serve":
                    words.insert(1, "serve")
                words[2:2] = ["--backend", backend]
            lines[i] = "ExecStart=" + " ".join(words) + "\n"
            return "".join(lines)
    raise ValueError("the unit template has no ExecStart= line")


def unit_socket(unit_text: str) -> str:
    """The control socket the unit's ExecStart passes with --socket (else :data:`DEFAULT_UNIT_SOCKET`)."""
    for line in unit_text.splitlines():
        if line.startswith("ExecStart="):
            words = shlex.split(line[len("ExecStart="):])
            if "--socket" in words[:-1]:
                return words[words.index("--socket") + 1]
    return DEFAULT_UNIT_SOCKET


def node_toml(target: Target, prefix: str, socket_path: str | None = None) -> str:
    """The ``[[node]]`` table to add to the fleet config for this node (TOML text, newline-ended):
    name, host, the node's own SSH settings when it came from the config, and gpuctld =
    PREFIX/bin/gpuctld."""
    n = target.node
    rows: list[tuple[str, Any]] = [("name", n.name), ("host", n.host)]
    rows += [(k, getattr(n, k)) for k in ("user", "port", "identity_file") if getattr(n, k) is not None]
    if target.from_config and n.timeout_s != NodeConfig.timeout_s:
        rows.append(("timeout_s", n.timeout_s))
    if socket_path or n.socket:
        rows.append(("socket", socket_path or n.socket))
    rows.append(("gpuctld", f"{prefix}/bin/gpuctld"))
    return "[[node]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in rows)


# --------------------------------------------------------------------------- wheel


def find_source_dir() -> Path | None:
    """The source tree of the running gpuctl (the directory holding pyproject.toml with name
    "gpuctl" next to the gpuctl package), or None for an installed gpuctl."""
    root = Path(__file__).resolve().parents[2]
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return None
    return root if re.search(r'^name\s*=\s*"gpuctl"\s*$', text, re.MULTILINE) else None


_COPY_IGNORE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".venv",
                                      ".pytest_cache", ".hypothesis", ".whl", ".gl", "__snapshots__")


def build_wheel(source_dir: Path, out_dir: Path, *, python: str = sys.executable, timeout_s: float = 600.0) -> Path:
    """Build gpuctl's wheel from `source_dir` into `out_dir` with ``python -m pip wheel --no-deps``,
    on a clean copy of the tree (a stale build/ directory never leaks into the wheel). Returns the
    wheel's path. Raises BootstrapError (FAILURE) with pip's stderr tail and the --wheel hint."""
    hint = "build one yourself (python -m pip wheel --no-deps -w dist .) and pass --wheel PATH"
    with tempfile.TemporaryDirectory(prefix="gpuctl-wheel-src-") as tmp:
        copy = Path(tmp) / "src"
        try:
            shutil.copytree(source_dir, copy, ignore=_COPY_IGNORE, symlinks=True)
        except (OSError, shutil.Error) as exc:
            raise BootstrapError(f"cannot copy the source tree {source_dir} to build a wheel: {exc}; {hint}",
                                 ExitCode.FAILURE, step="build-wheel") from exc
        cmd = [python, "-m", "pip", "wheel", "--no-deps", "--no-input", "--disable-pip-version-check",
               "-q", "-w", str(out_dir), str(copy)]
        shown = shlex.join(cmd[:-2] + [str(out_dir), str(source_dir)])
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BootstrapError(f"cannot build a wheel from {source_dir} (`{shown}`): {exc}; {hint}",
                                 ExitCode.FAILURE, step="build-wheel", command=shown) from exc
    wheels = sorted(out_dir.glob("gpuctl-*.whl"))
    if p.returncode != 0 or len(wheels) != 1:
        tail = _tail(p.stderr or p.stdout)
        raise BootstrapError(
            f"cannot build a wheel from {source_dir}: `{shown}` exited with status {p.returncode}: {tail or 'no message'}; "
            f"{hint}", ExitCode.FAILURE, step="build-wheel", command=shown, rc=p.returncode, stderr_tail=tail)
    return wheels[0]


def check_wheel(path: Path) -> Path:
    """`path` if it is a readable gpuctl wheel file (gpuctl-VERSION-...whl), else BootstrapError (USAGE)."""
    if not path.is_file():
        raise _usage(f"--wheel {path}: no such file")
    if not re.fullmatch(r"gpuctl-[^-]+-[^-]+-[^-]+-[^-]+(-[^-]+)?\.whl", path.name):
        raise _usage(f"--wheel {path}: not a gpuctl wheel (expected gpuctl-VERSION-py3-none-any.whl)")
    if not os.access(path, os.R_OK):
        raise _usage(f"--wheel {path}: not readable")
    return path


# --------------------------------------------------------------------------- steps


@dataclass
class StepReport:
    """One step's outcome: name (stable id), description, status ("ok", "failed", "skipped",
    "planned"), detail (what was found or done), command (what ran; None for none), rc,
    stderr_tail, duration_s (seconds)."""

    name: str
    description: str
    status: str = "planned"
    detail: str = ""
    command: str | None = None
    rc: int | None = None
    stderr_tail: str | None = None
    duration_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The step as a JSON object (the fields above)."""
        return {"name": self.name, "description": self.description, "status": self.status, "detail": self.detail,
                "command": self.command, "rc": self.rc, "stderr_tail": self.stderr_tail,
                "duration_s": None if self.duration_s is None else round(self.duration_s, 3)}


@dataclass
class BootstrapResult:
    """What happened: target, options, wheel (local path or None when not built yet), steps
    (StepReport, in order), error (BootstrapError or None), node_toml (the snippet), remote_tmp
    (the node's temporary directory, removed at the end; None if none was made), dry_run."""

    target: Target
    options: BootstrapOptions
    wheel: Path | None
    steps: list[StepReport]
    error: BootstrapError | None = None
    node_toml: str = ""
    remote_tmp: str | None = None
    dry_run: bool = False
    address: str | None = None

    @property
    def exit_code(self) -> ExitCode:
        """OK, or the error's exit code."""
        return self.error.exit_code if self.error else ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        """The ``gpuctl node bootstrap --json`` document (README documents it)."""
        o = self.options
        err = self.error
        return {
            "node": self.target.name, "host": self.target.node.host, "address": self.address,
            "from_config": self.target.from_config, "dry_run": self.dry_run, "ok": err is None,
            "exit_code": int(self.exit_code), "prefix": o.prefix, "gpuctld": o.gpuctld, "python": o.python,
            "backend": o.backend, "systemd": o.systemd, "system_site_packages": o.system_site_packages,
            "no_index": o.no_index, "find_links": o.find_links, "sudo": o.sudo, "wheel": str(self.wheel) if self.wheel else None,
            "remote_tmp": self.remote_tmp, "steps": [s.to_json() for s in self.steps],
            "error": None if err is None else {"message": err.message, "step": err.step, "command": err.command,
                                               "rc": err.rc, "stderr_tail": err.stderr_tail},
            "node_toml": self.node_toml,
        }


def _tail(text: str | bytes, lines: int = STDERR_TAIL_LINES) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    kept = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    return "\n".join(kept[-lines:])


def _q(word: str) -> str:
    return shlex.quote(word)


class Bootstrap:
    """One bootstrap run on one node.

    target, options: what and how. transport: an SshTransport (or anything with connect(), run(),
    put_file(), address and close()) for the target's node; unit_template: the unit file text
    (deploy/gpuctld.service; required with options.systemd, else ValueError). wheel: a gpuctl wheel, or None to
    build one from `source_dir`. progress: called with one line per step start/end (stderr in the CLI).
    """

    def __init__(self, target: Target, options: BootstrapOptions, *, transport: Any, wheel: Path | None,
                 unit_template: str | None = None, source_dir: Path | None = None,
                 progress: Callable[[str], None] = lambda line: None):
        self.target = target
        self.options = options
        self.transport = transport
        self.wheel = wheel
        self.source_dir = source_dir
        self.progress = progress
        if options.systemd and unit_template is None:
            raise ValueError("options.systemd needs unit_template (deploy/gpuctld.service: load_unit_template())")
        self.unit_text = (render_unit(unit_template, prefix=options.prefix, backend=options.backend)
                          if options.systemd and unit_template is not None else None)
        self.socket_path = unit_socket(self.unit_text) if self.unit_text else None
        self.tmp: str | None = None
        self.steps = self._plan()

    # ------------------------------------------------------------------ plan

    def _sudo(self, command: str) -> str:
        return f"sudo -n {command}" if self.options.sudo else command

    def _wheel_remote(self) -> str:
        name = self.wheel.name if self.wheel else "gpuctl-VERSION-py3-none-any.whl"
        return f"{self.tmp or '$TMP'}/{name}"

    def _cmd(self, name: str) -> str | None:
        """The command line of step `name` as it runs (``$TMP`` stands for the temp dir before it exists)."""
        o = self.options
        p = _q(o.prefix)
        py = _q(o.python)
        no_index = " --no-index" if o.no_index else ""
        if o.find_links:
            no_index += f" --find-links {_q(o.find_links)}"
        wheel = _q(self._wheel_remote()) if self.tmp else self._wheel_remote()
        if name == "check-python":
            return f"{py} -c " + _q('import sys; print("%d.%d.%d" % sys.version_info[:3]); import venv, ensurepip')
        if name == "check-root":
            return "id -u"
        if name == "upload":
            return "mktemp -d /tmp/gpuctl-bootstrap.XXXXXXXX; sftp put WHEEL" + (" UNIT" if o.systemd else "")
        if name == "create-venv":
            guard = (f'if [ -e {p} ] && [ ! -f {p}/pyvenv.cfg ] && [ -n "$(ls -A {p} 2>/dev/null)" ]; then '
                     f'echo "{p} exists and is not a Python virtual environment (no pyvenv.cfg): refusing to '
                     'install into it; choose another --prefix" >&2; exit 3; fi')
            site = " --system-site-packages" if o.system_site_packages else ""
            return f"sh -c {_q(guard)} && {self._sudo(f'{py} -m venv{site} {p}')}"
        if name == "install-gpuctl":
            pip = f"{p}/bin/python {_PIP}{no_index}"
            return f"{self._sudo(f'{pip} {wheel}')} && {self._sudo(f'{pip} --no-deps --force-reinstall {wheel}')}"
        if name == "verify":
            return (f"{p}/bin/gpuctld bridge --help >/dev/null && "
                    f"{p}/bin/python -c " + _q("import gpuctl; print(gpuctl.__version__)"))
        if name == "install-unit":
            unit = f"{self.tmp or '$TMP'}/gpuctld.service"
            return self._sudo(f"install -m 0644 {_q(unit) if self.tmp else unit} {UNIT_PATH}")
        if name == "start-service":
            return " && ".join(self._sudo(f"systemctl {c}") for c in ("daemon-reload", "enable gpuctld",
                                                                         "restart gpuctld"))
        if name == "health":
            return self._bridge_command() + "  (stdin: GET /v1/health)"
        if name == "cleanup":
            return f"rm -rf {_q(self.tmp) if self.tmp else '$TMP'}"
        return None

    def _plan(self) -> list[StepReport]:
        o = self.options
        steps: list[tuple[str, str]] = []
        if self.wheel is None:
            steps.append(("build-wheel", f"build gpuctl's wheel from {self.source_dir or 'the source tree'}"))
        where = f"{self.target.name}" + (f" ({self.target.node.host})" if self.target.from_config else "")
        steps += [("connect", f"connect to {where} over SSH"),
                  ("check-python", f"check that {o.python} on the node is Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]} with venv")]
        if o.systemd and not o.sudo:
            steps.append(("check-root", "check that the SSH account is root (systemd unit)"))
        steps += [("upload", "upload the wheel" + (" and the systemd unit" if o.systemd else "") + " over SFTP to a temp dir"),
                  ("create-venv", f"create or update the virtual environment {o.prefix}"
                   + (" (with system site packages)" if o.system_site_packages else "")),
                  ("install-gpuctl", f"pip install the wheel into {o.prefix}" + (" (no package index)" if o.no_index else "")
                   + (f" (wheels from {o.find_links})" if o.find_links else "")),
                  ("verify", f"check that {o.gpuctld} runs")]
        if o.systemd:
            steps += [("install-unit", f"write {UNIT_PATH} (ExecStart {o.gpuctld} serve --backend {o.backend})"),
                      ("start-service", "systemctl daemon-reload, enable and restart gpuctld"),
                      ("health", f"wait until `{o.gpuctld} bridge` reaches the daemon (up to {o.health_timeout_s:g} s)")]
        steps.append(("cleanup", "remove the temp dir on the node"))
        return [StepReport(name, desc, command=self._cmd(name)) for name, desc in steps]

    def result(self, *, dry_run: bool = False, error: BootstrapError | None = None) -> BootstrapResult:
        """The BootstrapResult as things stand (the plan when nothing ran)."""
        return BootstrapResult(self.target, self.options, self.wheel, self.steps, error=error,
                               node_toml=node_toml(self.target, self.options.prefix,
                                                   self.socket_path if self.socket_path != DEFAULT_UNIT_SOCKET else None),
                               remote_tmp=self.tmp, dry_run=dry_run,
                               address=getattr(self.transport, "address", None))

    # ------------------------------------------------------------------ run

    def run(self, *, wheel_dir: Path | None = None) -> BootstrapResult:
        """Run every step; returns the result (its `error` set when a step failed; later steps
        "skipped"; the node's temp dir is removed either way). wheel_dir: where a built wheel goes
        (default a temporary directory, removed afterwards). Never raises BootstrapError."""
        error: BootstrapError | None = None
        with tempfile.TemporaryDirectory(prefix="gpuctl-wheel-") as tmp_wheels:
            try:
                for step in self.steps:
                    if step.name == "cleanup":
                        continue
                    self._run_step(step, Path(wheel_dir or tmp_wheels))
            except BootstrapError as exc:
                error = exc
            finally:
                cleanup = next(s for s in self.steps if s.name == "cleanup")
                if self.tmp is not None:
                    self._cleanup(cleanup)
                else:
                    cleanup.status, cleanup.detail = "skipped", "no temp dir was made"
                for s in self.steps:
                    if s.status == "planned":
                        s.status = "skipped"
            return self.result(error=error)

    def _run_step(self, step: StepReport, wheel_dir: Path) -> None:
        index = self.steps.index(step) + 1
        self.progress(f"[{index}/{len(self.steps)}] {step.description} ...")
        started = time.monotonic()
        try:
            step.detail = getattr(self, "_step_" + step.name.replace("-", "_"))(step, wheel_dir) or ""
        except BootstrapError as exc:
            step.status = "failed"
            step.duration_s = time.monotonic() - started
            step.rc = exc.rc
            step.stderr_tail = exc.stderr_tail
            step.command = exc.command or step.command
            step.detail = exc.message
            exc.step = exc.step or step.name
            self.progress(f"[{index}/{len(self.steps)}] {step.name} FAILED ({step.duration_s:.1f} s)")
            raise
        step.status = "ok"
        step.duration_s = time.monotonic() - started
        step.command = self._cmd(step.name) if step.name not in ("build-wheel", "connect") else step.command
        self.progress(f"[{index}/{len(self.steps)}] {step.name} ok ({step.duration_s:.1f} s)"
                      + (f": {step.detail}" if step.detail else ""))

    def _fail(self, step: str, message: str, *, command: str | None = None, rc: int | None = None,
              stderr: bytes | str = b"", exit_code: int = ExitCode.FAILURE) -> BootstrapError:
        tail = _tail(stderr) or None
        return BootstrapError(f"node {self.target.name}: step {step} failed: {message}"
                              + (f"\n{tail}" if tail else ""), exit_code, step=step, command=command, rc=rc,
                              stderr_tail=tail)

    def _remote(self, step: str, command: str, *, stdin: bytes | None = None, timeout_s: float | None = None,
                check: bool = True):
        """Run `command` on the node; with `check`, a non-zero status or timeout is a BootstrapError."""
        from gpuctl.transport.errors import TransportError

        try:
            r = self.transport.run(command, stdin=stdin, timeout_s=timeout_s or self.options.command_timeout_s)
        except TransportError as exc:
            raise BootstrapError(f"{exc} (during step {step})", _transport_exit(exc), step=step,
                                 command=command) from exc
        if check and r.timed_out:
            raise self._fail(step, f"`{command}` did not finish within {timeout_s or self.options.command_timeout_s:g} s",
                             command=command, stderr=r.stderr)
        if check and r.rc != 0:
            status = "no exit status" if r.rc is None else f"exit status {r.rc}"
            raise self._fail(step, f"`{command}` failed ({status})", command=command, rc=r.rc,
                             stderr=r.stderr or r.stdout)
        return r

    # ------------------------------------------------------------------ the steps

    def _step_build_wheel(self, step: StepReport, wheel_dir: Path) -> str:
        if self.source_dir is None:
            raise BootstrapError(
                f"cannot build a wheel: the running gpuctl ({Path(__file__).resolve().parents[1]}) is not in a "
                "source tree with pyproject.toml; pass --wheel PATH (a gpuctl wheel, e.g. from "
                "`python -m pip wheel --no-deps -w dist .` in a checkout)", ExitCode.FAILURE, step="build-wheel")
        step.command = f"{sys.executable} -m pip wheel --no-deps -w {wheel_dir} {self.source_dir}"
        self.wheel = build_wheel(self.source_dir, wheel_dir)
        for s in self.steps:
            s.command = self._cmd(s.name) or s.command
        return f"built {self.wheel.name}"

    def _step_connect(self, step: StepReport, wheel_dir: Path) -> str:
        from gpuctl.transport.errors import TransportError

        try:
            self.transport.connect()
        except TransportError as exc:
            raise BootstrapError(str(exc), _transport_exit(exc), step="connect") from exc
        return f"connected to {self.transport.address}"

    def _step_check_python(self, step: StepReport, wheel_dir: Path) -> str:
        o = self.options
        command = self._cmd("check-python")
        r = self._remote("check-python", command, timeout_s=60, check=False)
        out = r.stdout.decode("utf-8", "replace").strip().splitlines()
        m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", out[0].strip()) if out else None
        if r.rc == 127 or (r.rc != 0 and m is None and b"not found" in r.stderr):
            raise self._fail("check-python", f"no Python {o.python!r} on the node (`{command}`: exit status "
                             f"{r.rc}); install Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or pass --python PATH",
                             command=command, rc=r.rc, stderr=r.stderr)
        if m is None:
            raise self._fail("check-python", f"`{command}` did not print a Python version (exit status {r.rc})",
                             command=command, rc=r.rc, stderr=r.stderr or r.stdout)
        version = tuple(int(x) for x in m.groups())
        found = ".".join(m.groups())
        if version[:2] < MIN_PYTHON:
            raise self._fail("check-python", f"{o.python} on the node is Python {found}; gpuctl needs Python >= "
                             f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]} (install a newer one, or pass --python PATH)",
                             command=command, rc=r.rc)
        if r.rc != 0:
            raise self._fail("check-python", f"{o.python} on the node is Python {found} but has no venv/ensurepip "
                             "module (Debian/Ubuntu: apt install python3-venv)", command=command, rc=r.rc,
                             stderr=r.stderr)
        return f"Python {found}"

    def _step_check_root(self, step: StepReport, wheel_dir: Path) -> str:
        r = self._remote("check-root", "id -u", timeout_s=60)
        uid = r.stdout.decode("utf-8", "replace").strip()
        if uid != "0":
            raise BootstrapError(
                f"node {self.target.name}: step check-root failed: the SSH account (uid {uid}) is not root and "
                f"writing {UNIT_PATH} needs root: log in as root, pass --sudo (passwordless sudo), or "
                "--no-systemd", ExitCode.FAILURE, step="check-root", command="id -u", rc=r.rc)
        return "uid 0"

    def _step_upload(self, step: StepReport, wheel_dir: Path) -> str:
        r = self._remote("upload", "mktemp -d /tmp/gpuctl-bootstrap.XXXXXXXX", timeout_s=60)
        tmp = r.stdout.decode("utf-8", "replace").strip()
        if not tmp.startswith("/tmp/gpuctl-bootstrap."):
            raise self._fail("upload", f"mktemp printed {tmp!r}, not a directory", command=r.command)
        self.tmp = tmp
        for s in self.steps:
            s.command = self._cmd(s.name) or s.command
        files = [(self.wheel, f"{tmp}/{self.wheel.name}")]
        local_unit: Path | None = None
        try:
            if self.unit_text is not None:
                with tempfile.NamedTemporaryFile("w", suffix=".service", delete=False, encoding="utf-8") as f:
                    f.write(self.unit_text)
                    local_unit = Path(f.name)
                files.append((local_unit, f"{tmp}/gpuctld.service"))
            done = []
            for local, remote in files:
                size = self._put(local, remote)
                done.append(f"{remote} ({size} bytes)")
        finally:
            if local_unit is not None:
                local_unit.unlink(missing_ok=True)
        return ", ".join(done)

    def _put(self, local: Path, remote: str) -> int:
        from gpuctl.transport.errors import TransportError

        command = f"sftp put {local} {remote}"
        try:
            return self.transport.put_file(local, remote, 0o644)
        except TransportError as exc:
            raise BootstrapError(f"{exc} (during step upload)", _transport_exit(exc), step="upload",
                                 command=command) from exc
        except OSError as exc:
            raise BootstrapError(f"node {self.target.name}: step upload failed: {exc.strerror or exc}",
                                 ExitCode.FAILURE, step="upload", command=command) from exc

    def _step_create_venv(self, step: StepReport, wheel_dir: Path) -> str:
        self._remote("create-venv", self._cmd("create-venv"))
        return self.options.prefix

    def _step_install_gpuctl(self, step: StepReport, wheel_dir: Path) -> str:
        self._remote("install-gpuctl", self._cmd("install-gpuctl"))
        return f"{self.wheel.name} installed"

    def _step_verify(self, step: StepReport, wheel_dir: Path) -> str:
        r = self._remote("verify", self._cmd("verify"), timeout_s=120)
        return f"gpuctl {r.stdout.decode('utf-8', 'replace').strip()} at {self.options.gpuctld}"

    def _step_install_unit(self, step: StepReport, wheel_dir: Path) -> str:
        self._remote("install-unit", self._cmd("install-unit"), timeout_s=60)
        return UNIT_PATH

    def _step_start_service(self, step: StepReport, wheel_dir: Path) -> str:
        self._remote("start-service", self._cmd("start-service"), timeout_s=120)
        return "gpuctld enabled and (re)started"

    def _step_health(self, step: StepReport, wheel_dir: Path) -> str:
        healthy, detail = wait_healthy(self._remote, self._bridge_command(), timeout_s=self.options.health_timeout_s)
        if healthy:
            return detail
        logs = self._remote("health", self._sudo("journalctl -u gpuctld -n 15 --no-pager"), timeout_s=30, check=False)
        last = detail
        raise self._fail("health", f"gpuctld did not answer /v1/health within {self.options.health_timeout_s:g} s "
                         f"(last try: {last}); the service's log follows",
                         command=self._cmd("health"), stderr=logs.stdout or logs.stderr)

    def _bridge_command(self) -> str:
        return self._sudo(f"{_q(self.options.gpuctld)} bridge --socket {_q(self.socket_path or DEFAULT_UNIT_SOCKET)}")

    def _cleanup(self, step: StepReport) -> None:
        from gpuctl.transport.errors import TransportError

        started = time.monotonic()
        step.command = self._cmd("cleanup")
        try:
            r = self.transport.run(step.command, timeout_s=60)
            ok = r.rc == 0
            step.rc = r.rc
            step.stderr_tail = _tail(r.stderr) or None
        except TransportError as exc:
            ok = False
            step.stderr_tail = str(exc)
        step.duration_s = time.monotonic() - started
        step.status = "ok" if ok else "failed"
        step.detail = f"removed {self.tmp}" if ok else f"could not remove {self.tmp} on the node (remove it by hand)"
        self.progress(f"[{len(self.steps)}/{len(self.steps)}] cleanup {'ok' if ok else 'FAILED'}: {step.detail}")


def wait_healthy(remote: Callable[..., Any], bridge_command: str, *, timeout_s: float,
                 interval_s: float = 1.0) -> tuple[bool, str]:
    """Ask the daemon for ``GET /v1/health`` through `bridge_command` (``gpuctld bridge --socket
    PATH`` on the node) until it answers 200 or `timeout_s` seconds pass.

    remote: ``remote(step, command, stdin=..., timeout_s=..., check=False)`` -> object with rc,
    stdout, stderr (Bootstrap._remote). Returns (True, "healthy (HTTP/1.1 200 OK)"), or after
    the timeout (False, the last try's one-line reason: the bridge's message or the status line).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        r = remote("health", bridge_command, stdin=HEALTH_REQUEST,
                   timeout_s=max(1.0, min(10.0, deadline - time.monotonic())), check=False)
        first = r.stdout.split(b"\r\n", 1)[0].decode("latin-1", "replace")
        if r.rc == 0 and first.startswith("HTTP/1.1 200"):
            return True, f"healthy ({first})"
        last = first or _tail(r.stderr, 1) or ("timed out" if r.timed_out else f"exit status {r.rc}")
        if time.monotonic() + interval_s > deadline:
            return False, last
        time.sleep(interval_s)


def _transport_exit(exc: Exception) -> ExitCode:
    return ExitCode.CONFIG if getattr(exc, "code", None) == "config" else ExitCode.UNREACHABLE


def load_unit_template(path: Path = UNIT_TEMPLATE) -> str:
    """The systemd unit template's text. Raises BootstrapError (FAILURE) when it is not there
    (an installed gpuctl has no deploy/ directory: pass --no-systemd or run from a checkout)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BootstrapError(f"the systemd unit template {path} cannot be read ({exc.strerror or exc}): run gpuctl "
                             "from its source tree, or pass --no-systemd and install the unit by hand",
                             ExitCode.FAILURE) from exc
    try:
        render_unit(text, prefix=DEFAULT_PREFIX, backend="auto")
    except ValueError as exc:
        raise BootstrapError(f"{path}: {exc}", ExitCode.FAILURE) from exc
    return text


__all__ = ["BACKENDS", "DEFAULT_PREFIX", "MIN_PYTHON", "UNIT_PATH", "Bootstrap", "BootstrapError",
           "BootstrapOptions", "BootstrapResult", "StepReport", "Target", "build_wheel", "check_wheel",
           "find_source_dir", "load_unit_template", "node_toml", "render_unit", "resolve_target", "unit_socket",
           "wait_healthy"]
