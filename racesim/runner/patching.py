"""``--vllm-patch FILE``: a unified diff applied to a shadow tree of the installed release.

The shadow tree mirrors the installed ``vllm`` package with symlinks (folders are real, files
link to the installed ones), and each file the diff touches is a real file with the diff
applied; the installed release is never written to. It is cached outside the checkout, under
``$RACESIM_CACHE`` (default ``~/.cache/racesim``) ``/patched/<diff sha256>-<release>/``, built in
a temporary folder and renamed into place, so concurrent runs share one and a half-built tree
is never seen.

Paths in the diff are as ``git diff`` in a vLLM checkout writes them (``a/vllm/v1/...``), or
relative to the ``vllm`` package. A hunk applies where its context and removed lines match the
file exactly, at its stated line or the nearest offset (``patch`` without fuzz); one that does
not is one line naming the file and the hunk, and exit 2.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from racesim.sim.errors import InputError

__all__ = ["check_patch", "patched_tree", "parse_patch", "cache_root"]

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
MAX_PATCH_BYTES = 16 << 20


@dataclass
class _Hunk:
    header: str
    old_start: int
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)


@dataclass
class _FilePatch:
    path: str  # relative to the folder holding vllm/ ("vllm/v1/engine/async_llm.py")
    new_file: bool = False
    deleted: bool = False
    hunks: list[_Hunk] = field(default_factory=list)


def cache_root() -> Path:
    return Path(os.environ.get("RACESIM_CACHE") or Path.home() / ".cache" / "racesim")


def _strip(name: str, src: str) -> str | None:
    name = name.split("\t")[0].strip()
    if name == "/dev/null":
        return None
    if name[:2] in ("a/", "b/"):
        name = name[2:]
    parts = PurePosixPath(name).parts
    if not parts or PurePosixPath(name).is_absolute() or ".." in parts:
        raise InputError(f"--vllm-patch {src}: path {name!r} leaves the vLLM tree")
    return name if parts[0] == "vllm" else str(PurePosixPath("vllm", *parts))


def parse_patch(text: str, src: str) -> list[_FilePatch]:
    """The files and hunks of a unified diff (``git diff`` or ``diff -u``), or exit 2."""
    files: list[_FilePatch] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = _strip(line[4:], src), _strip(lines[i + 1][4:], src)
            if old is None and new is None:
                raise InputError(f"--vllm-patch {src}: line {i + 1}: /dev/null on both sides")
            files.append(_FilePatch(new or old or "", new_file=old is None, deleted=new is None))
            i += 2
            continue
        m = _HUNK.match(line)
        if m:
            if not files:
                raise InputError(f"--vllm-patch {src}: line {i + 1}: a hunk before any "
                                 f"'--- '/'+++ ' file header")
            old_n = int(m.group(2)) if m.group(2) is not None else 1
            new_n = int(m.group(4)) if m.group(4) is not None else 1
            hunk = _Hunk(line.rstrip("\n"), int(m.group(1)))
            i += 1
            while (old_n > 0 or new_n > 0) and i < len(lines):
                body = lines[i]
                tag, rest = body[:1], body[1:]
                if body.startswith("\\"):  # "\ No newline at end of file"
                    i += 1
                    continue
                if tag in (" ", "") or body in ("\n", "\r\n"):
                    rest = rest if tag == " " else "\n"
                    hunk.old.append(rest)
                    hunk.new.append(rest)
                    old_n, new_n = old_n - 1, new_n - 1
                elif tag == "-":
                    hunk.old.append(rest)
                    old_n -= 1
                elif tag == "+":
                    hunk.new.append(rest)
                    new_n -= 1
                else:
                    break
                i += 1
            if old_n > 0 or new_n > 0:
                raise InputError(f"--vllm-patch {src}: {files[-1].path}: hunk "
                                 f"{len(files[-1].hunks) + 1} ({hunk.header}) is cut short")
            while i < len(lines) and lines[i].startswith("\\"):
                if hunk.new:  # the last line has no newline
                    hunk.new[-1] = hunk.new[-1].rstrip("\n")
                i += 1
            files[-1].hunks.append(hunk)
            continue
        i += 1
    return files


def _apply(text: str, fp: _FilePatch, src: str, release: str) -> str:
    lines = text.splitlines(keepends=True)
    shift = 0
    for n, hunk in enumerate(fp.hunks, 1):
        want = max(0, hunk.old_start - 1 + shift) if hunk.old else hunk.old_start + shift
        at = _find(lines, hunk.old, want)
        if at is None:
            raise InputError(f"--vllm-patch {src}: hunk {n} ({hunk.header}) of {fp.path} does "
                             f"not apply to vLLM {release}")
        lines[at:at + len(hunk.old)] = hunk.new
        shift += len(hunk.new) - len(hunk.old) + (at - want if hunk.old else 0)
    return "".join(lines)


def _find(lines: list[str], old: list[str], want: int) -> int | None:
    """Where ``old`` matches ``lines``: at ``want`` or the nearest offset from it."""
    if not old:
        return min(max(want, 0), len(lines))
    norm = [s.rstrip("\r\n") for s in old]
    last = len(lines) - len(old)
    for delta in range(0, max(want, last - want) + 1):
        for at in ((want,) if delta == 0 else (want - delta, want + delta)):
            if 0 <= at <= last and all(lines[at + j].rstrip("\r\n") == norm[j]
                                       for j in range(len(old))):
                return at
    return None


def _read(src: str) -> tuple[Path, bytes]:
    path = Path(src).expanduser()
    if not path.is_file():
        raise InputError(f"--vllm-patch {src}: no such file")
    if path.stat().st_size > MAX_PATCH_BYTES:
        raise InputError(f"--vllm-patch {src}: over {MAX_PATCH_BYTES >> 20} MB; not a patch")
    return path.resolve(), path.read_bytes()


def check_patch(src: str, release: str) -> tuple[Path, str]:
    """Read, check and apply ``src`` (its shadow tree built now, or found cached): the diff's
    absolute path and sha256, or exit 2 naming what does not apply."""
    path, data = _read(src)
    patched_tree(path, release)
    return path, hashlib.sha256(data).hexdigest()


def patched_tree(path: Path, release: str, sha256: str | None = None) -> Path:
    """The folder holding the patched ``vllm/`` for the diff at ``path`` over the installed
    ``release`` (built on first use, then cached by the diff's hash)."""
    from racesim.runner.vllm_tree import installed_package_dir

    path, data = _read(str(path))
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is not None and digest != sha256:
        raise InputError(f"--vllm-patch {path}: changed since it was checked (sha256 "
                         f"{digest[:12]}, expected {sha256[:12]})")
    final = cache_root() / "patched" / f"{digest}-{release}"
    if (final / "vllm" / "__init__.py").exists():
        return final
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"--vllm-patch {path}: not UTF-8 text") from None
    files = parse_patch(text, str(path))
    if not files and text.strip():  # an empty file is an empty change: the release itself
        raise InputError(f"--vllm-patch {path}: no '--- '/'+++ ' file header: not a unified "
                         f"diff")
    installed = installed_package_dir()
    if installed is None:
        raise InputError(f"--vllm-patch {path}: the installed vLLM's package folder is not found")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
    try:
        _mirror(installed, tmp / "vllm")
        for fp in files:
            _patch_file(tmp, installed.parent, fp, str(path), release)
        try:
            os.rename(tmp, final)
        except OSError:  # another process built it first: theirs is the same tree
            if not (final / "vllm" / "__init__.py").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _mirror(src: Path, dst: Path) -> None:
    """Real folders, files linked to the installed ones (``__pycache__`` left out)."""
    for folder, dirs, names in os.walk(src):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = Path(folder).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in names:
            os.symlink(Path(folder) / name, dst / rel / name)


def _patch_file(tmp: Path, installed_root: Path, fp: _FilePatch, src: str,
                release: str) -> None:
    target = tmp / fp.path
    original = installed_root / fp.path
    if fp.new_file:
        if original.exists():
            raise InputError(f"--vllm-patch {src}: {fp.path} is a new file in the patch but "
                             f"exists in vLLM {release}")
        text = ""
    else:
        if not original.is_file():
            raise InputError(f"--vllm-patch {src}: {fp.path} is not in vLLM {release}")
        text = original.read_text(encoding="utf-8")
    out = _apply(text, fp, src, release)
    if target.is_symlink() or target.exists():
        target.unlink()
    if fp.deleted:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(out, encoding="utf-8")
