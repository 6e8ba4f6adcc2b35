"""Writing output files without destroying what the user did not ask to replace.

A regular file (or a new one) is replaced atomically: a temp file in the same folder, renamed,
so a reader never sees half a report and a failed write leaves the old file alone. A symlink is
written through to its target (the link stays a link). A named pipe or ``/dev/null`` is written
through, as ``tee`` does. A folder, any other device and anything else is refused: a write never
replaces a non-regular file. Every error names the path the user gave, never a temp file.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from racesim.sim.errors import InputError

__all__ = ["write_text", "write_new", "check_output_file", "check_output_dir"]


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # read once, at import: os.umask is process-wide


def _is_dev_null(st: os.stat_result) -> bool:
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(null.st_mode) and st.st_rdev == null.st_rdev  # the device, any node


def _target(path: Path) -> tuple[Path, os.stat_result | None]:
    """The file a write to ``path`` lands in (symlinks followed) and its stat, None if absent."""
    real = Path(os.path.realpath(path))
    try:
        return real, os.stat(real)
    except FileNotFoundError:
        return real, None


def _why_not(path: Path) -> str | None:
    """Why ``path`` cannot take an output file, or None when it can."""
    try:
        real, st = _target(path)
    except OSError as exc:
        return f"cannot use it ({exc.strerror or exc})"
    if st is None:
        parent = real.parent
        if not parent.is_dir():
            return f"folder {str(parent)!r} does not exist"
        if not os.access(parent, os.W_OK | os.X_OK):
            return f"cannot create a file in folder {str(parent)!r} (permission denied)"
        return None
    mode = st.st_mode
    if stat.S_ISREG(mode):
        if not os.access(real.parent, os.W_OK | os.X_OK) and not os.access(real, os.W_OK):
            return "permission denied"
        return None
    if stat.S_ISFIFO(mode) or (stat.S_ISCHR(mode) and _is_dev_null(st)):
        return None if os.access(real, os.W_OK) else "permission denied"
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    kind = ("a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
    return f"is {kind}; racesim writes only regular files, pipes and /dev/null"


def check_output_file(option: str, path: str | os.PathLike[str] | None) -> None:
    """Refuse, before any work starts, an output path that a write would fail on or damage."""
    if path is None:
        return
    shown = os.fspath(path)
    problem = _why_not(Path(shown))
    if problem:
        raise InputError(f"{option} {shown!r}: {problem}")


def check_output_dir(option: str, path: str | os.PathLike[str]) -> Path:
    """Create the output folder now, so that a bad one fails before exploring, not after."""
    shown = os.fspath(path)
    p = Path(shown)
    if p.exists() and not p.is_dir():
        raise InputError(f"{option} {shown!r}: exists and is not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{option} {shown!r}: cannot create it ({exc.strerror or exc})") \
            from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise InputError(f"{option} {shown!r}: cannot write into it (permission denied)")
    return p


def _write_through(real: Path, text: str, *, truncate: bool = False) -> None:
    # O_WRONLY without O_CREAT: a pipe or /dev/null is written, never replaced.
    fd = os.open(real, os.O_WRONLY | (os.O_TRUNC if truncate else 0))
    with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)


def _replace(real: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, real)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` as the module docstring says; returns ``path``.

    Any failure is an :class:`~racesim.sim.errors.InputError` naming ``path``.
    """
    path = Path(path)
    shown = os.fspath(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        real, st = _target(path)
        if st is not None and not stat.S_ISREG(st.st_mode):
            problem = _why_not(path)
            if problem:
                raise InputError(f"{shown!r}: {problem}")
            _write_through(real, text)
        elif st is not None and not os.access(real.parent, os.W_OK | os.X_OK):
            _write_through(real, text, truncate=True)  # a writable file in a locked folder
        else:
            _replace(real, text)
    except OSError as exc:
        raise InputError(f"cannot write {shown!r}: {exc.strerror or type(exc).__name__}") \
            from None
    return path


#: link() errors that mean "this file system has no hard links", not "the name is taken"
_NO_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOSYS)


def write_new(path: Path, text: str, replaceable: Callable[[Path], bool]) -> bool:
    """Create ``path`` holding ``text`` only if no file has that name, else replace the file
    only when ``replaceable(path)`` says so; False when the name is taken.

    The name is claimed by an exclusive create (a complete temp file hard-linked to it, which
    fails if the name exists, or ``O_EXCL`` where the file system has no hard links), so two
    processes that chose the same name never both write it: one gets False and moves on.
    """
    path = Path(path)
    shown = os.fspath(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
                fh.write(text)
            os.chmod(tmp, 0o666 & ~_UMASK)
            try:
                os.link(tmp, path)
                return True
            except FileExistsError:
                pass
            except OSError as exc:
                if exc.errno not in _NO_LINKS:
                    raise
                try:  # not atomic, but still exclusive
                    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
                except FileExistsError:
                    pass
                else:
                    with os.fdopen(out, "w", encoding="utf-8", newline="\n") as fh:
                        fh.write(text)
                    return True
            if not replaceable(path):
                return False
            os.replace(tmp, path)
            return True
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError as exc:
        raise InputError(f"cannot write {shown!r}: {exc.strerror or type(exc).__name__}") \
            from None
