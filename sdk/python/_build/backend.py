"""In-tree PEP 517 build backend of the dsec package: builds the wheel (and an sdist) with
the standard library alone, so installing needs no download (pyproject.toml
``backend-path``). The wheel is pure Python: ``dsec/`` plus its ``.dist-info`` (PEP 427,
PEP 566 metadata, RECORD with sha256 digests).
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _project() -> Tuple[str, str, str, str]:
    """name, version, summary and requires-python from pyproject.toml's [project]."""
    text = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    get = lambda k: re.search(rf'^{k}\s*=\s*"([^"]*)"', text, re.M).group(1)  # noqa: E731
    return get("name"), get("version"), get("description"), get("requires-python")


def _package_files() -> List[str]:
    """Paths (relative to the project) of the package's files: every .py and py.typed under dsec/."""
    out = []
    for d, _, files in os.walk(os.path.join(ROOT, "dsec")):
        for f in files:
            if f.endswith(".py") or f == "py.typed":
                out.append(os.path.relpath(os.path.join(d, f), ROOT))
    return sorted(out)


def _metadata() -> str:
    name, version, summary, requires = _project()
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    return (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {summary}\n"
        f"License: Apache-2.0\nRequires-Python: {requires}\nClassifier: Typing :: Typed\n"
        f"Description-Content-Type: text/markdown\n\n{readme}"
    )


def _dist_info() -> str:
    name, version, _, _ = _project()
    return f"{name}-{version}.dist-info"


def get_requires_for_build_wheel(config_settings: Optional[Dict] = None) -> List[str]:
    """Nothing: the backend is the standard library."""
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict] = None) -> List[str]:
    """Nothing."""
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Optional[Dict] = None) -> str:
    """Writes ``<name>-<version>.dist-info/METADATA`` and returns the directory's name."""
    d = os.path.join(metadata_directory, _dist_info())
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    return _dist_info()


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel(wheel_directory: str, config_settings: Optional[Dict] = None, metadata_directory: Optional[str] = None) -> str:
    """Builds ``<name>-<version>-py3-none-any.whl`` in ``wheel_directory``; returns its file name."""
    name, version, _, _ = _project()
    whl = f"{name}-{version}-py3-none-any.whl"
    di = _dist_info()
    record: List[str] = []
    with zipfile.ZipFile(os.path.join(wheel_directory, whl), "w", zipfile.ZIP_DEFLATED) as z:
        def add(arc: str, data: bytes) -> None:
            z.writestr(arc, data)
            record.append(_record_line(arc, data))

        for rel in _package_files():
            with open(os.path.join(ROOT, rel), "rb") as f:
                add(rel.replace(os.sep, "/"), f.read())
        add(f"{di}/METADATA", _metadata().encode())
        add(f"{di}/WHEEL", b"Wheel-Version: 1.0\nGenerator: dsec-backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        add(f"{di}/top_level.txt", b"dsec\n")
        record.append(f"{di}/RECORD,,")
        z.writestr(f"{di}/RECORD", "\n".join(record) + "\n")
    return whl


def build_sdist(sdist_directory: str, config_settings: Optional[Dict] = None) -> str:
    """Builds ``<name>-<version>.tar.gz`` (the package, its backend, tests, example, README)."""
    name, version, _, _ = _project()
    base = f"{name}-{version}"
    out = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, out), "w:gz") as t:
        for rel in ["pyproject.toml", "README.md"] + _package_files():
            t.add(os.path.join(ROOT, rel), f"{base}/{rel}")
        for d in ("_build", "tests", "examples"):
            for dp, _, files in os.walk(os.path.join(ROOT, d)):
                for f in sorted(files):
                    if f.endswith(".py"):
                        p = os.path.join(dp, f)
                        t.add(p, f"{base}/{os.path.relpath(p, ROOT)}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata().encode()
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return out
