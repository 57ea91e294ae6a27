"""A wheelhouse built from the distributions installed in this interpreter, with no network.

The bootstrap tests install gpuctl's wheel into a fresh venv on the "node" (this machine) with
`pip install --no-index --find-links WHEELHOUSE`: every dependency must be there as a wheel. pip
cannot download offline and `pip wheel` of an installed distribution needs its sdist, so each
installed distribution (a `*.dist-info` directory with a RECORD) is packed back into a wheel: the
files its RECORD lists under site-packages, its dist-info with a new RECORD, the tags from its own
WHEEL file (a compiled distribution keeps its platform tag). Scripts outside site-packages are left
out: pip writes console scripts again from entry_points.txt. This works the same in a virtualenv,
with the system pip, or in a --user install, which is what the README's test command may run in.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import re
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

#: dist-info files that belong to the installation, not to the wheel
_INSTALL_ONLY = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


def dependency_closure(project: str, extras: tuple[str, ...] = ()) -> list[md.Distribution]:
    """The installed distributions `project` needs (its requirements whose markers hold here, with
    `extras`, recursively), `project` itself left out. Raises LookupError naming a requirement that
    is not installed."""
    seen: dict[str, md.Distribution] = {}
    done: set[tuple[str, str]] = set()  # (distribution, extra) pairs whose requirements were walked
    todo = [(project, extra) for extra in ("", *extras)]
    while todo:
        name, extra = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if (key, extra) in done:
            continue
        done.add((key, extra))
        for text in md.distribution(name).requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": extra}):
                continue
            if extra and req.marker is None:
                continue  # walked already with extra ""
            dep = re.sub(r"[-_.]+", "-", req.name).lower()
            if dep not in seen:
                try:
                    seen[dep] = md.distribution(req.name)
                except md.PackageNotFoundError as exc:
                    raise LookupError(f"{name} needs {text}, which is not installed in this interpreter") from exc
            todo += [(req.name, e) for e in ("", *req.extras)]
    seen.pop(re.sub(r"[-_.]+", "-", project).lower(), None)
    return list(seen.values())


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(dist: md.Distribution, out_dir: Path) -> Path:
    """Write `dist` (an installed distribution) as a wheel into out_dir; returns the wheel's path.

    Raises ValueError when the distribution has no RECORD or WHEEL file (e.g. an egg-info install)."""
    wheel_meta = dist.read_text("WHEEL")
    files = dist.files
    if not wheel_meta or files is None:
        raise ValueError(f"{dist.metadata['Name']}: installed without a RECORD/WHEEL (not from a wheel); "
                         "cannot repack it")
    tags = [line.split(":", 1)[1].strip() for line in wheel_meta.splitlines() if line.startswith("Tag:")]
    py, abi, plat = (sorted({t.split("-")[i] for t in tags}) for i in range(3))
    info_dir = next(Path(str(f)).parts[0] for f in files if Path(str(f)).parts[0].endswith(".dist-info"))
    name, version = info_dir[: -len(".dist-info")].rsplit("-", 1)
    path = out_dir / f"{name}-{version}-{'.'.join(py)}-{'.'.join(abi)}-{'.'.join(plat)}.whl"
    record: list[str] = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for f in files:
            rel = Path(str(f))
            if rel.parts[0] == ".." or "__pycache__" in rel.parts:
                continue
            if rel.parts[0] == info_dir and rel.name in _INSTALL_ONLY:
                continue
            src = Path(dist.locate_file(f))
            if not src.is_file():
                continue
            data = src.read_bytes()
            info = zipfile.ZipInfo(rel.as_posix(), date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (src.stat().st_mode & 0o777) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
            record.append(f"{rel.as_posix()},{_record_hash(data)},{len(data)}")
        record.append(f"{info_dir}/RECORD,,")
        zf.writestr(f"{info_dir}/RECORD", "\n".join(record) + "\n")
    return path


def build_wheelhouse(project: str, out_dir: Path) -> list[Path]:
    """Wheels of every installed distribution `project` depends on, written to out_dir (created)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [repack(d, out_dir) for d in dependency_closure(project)]
