"""Loading a task's splits from the Hugging Face hub with `datasets`, offline-aware.

Every text task that can read the hub (translation, language modelling) goes through
`load_hub_splits`: it probes the hub once (an unreachable hub would otherwise cost ~25 s of retries,
minutes if packets are dropped), falls back to the local HF cache, and turns every failure into one
`ConfigError` line that says how to use local files instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlparse

from sparse_runner.checks import ConfigError
from sparse_runner.data.errors import DataUnavailable

logger = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = ("train", "val", "test")

#: Our split -> the hub dataset's split, unless ``hf_splits`` says otherwise.
DEFAULT_HF_SPLITS: dict[str, str] = {"train": "train", "val": "validation", "test": "test"}

#: Seconds to wait for a TCP connection to the hub before treating it as unreachable.
HUB_PROBE_TIMEOUT_S = 5.0


def hub_label(path: str, name: str | None) -> str:
    return f"{path} ({name})" if name else path


def _plain(value: Any) -> Any:
    """Hydra's DictConfig / ListConfig -> dict / list (``datasets`` expects plain containers)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _is_local(path: str) -> bool:
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    return path in _PACKAGED_DATASETS_MODULES or Path(os.path.expanduser(path)).exists()


def _proxy_configured() -> bool:
    return any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"))


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub endpoint (``HF_ENDPOINT``) opens within ``timeout`` seconds.

    Runs in a daemon thread because name resolution has no timeout of its own.
    """
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, name="hf-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


@contextlib.contextmanager
def _hub_offline(enabled: bool):
    """Make ``datasets`` / ``huggingface_hub`` behave as with ``HF_HUB_OFFLINE=1`` inside the block.

    Both libraries read these module flags at call time; in offline mode ``load_dataset`` goes straight
    to the local cache instead of retrying the network.
    """
    if not enabled:
        yield
        return
    import datasets.config
    from huggingface_hub import constants

    saved = (datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = True
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved


def _squeezed(text: str, limit: int = 300) -> str:
    # The whole message on one line, not just its first line: the hub's errors often say what went
    # wrong only after a generic first line.
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def hub_splits(hf_splits: Any, where: str) -> dict[str, str]:
    """Our split -> the hub's split: `hf_splits` (a mapping, possibly partial) over DEFAULT_HF_SPLITS."""
    splits = dict(DEFAULT_HF_SPLITS)
    given = _plain(hf_splits) or {}
    if not isinstance(given, Mapping):
        raise ConfigError(f"{where}: hf_splits must map our splits ({', '.join(SPLITS)}) to dataset splits, got {given!r}")
    unknown = sorted(set(given) - set(SPLITS))
    if unknown:
        raise ConfigError(f"{where}: hf_splits has unknown key(s) {', '.join(map(str, unknown))}; valid keys: {', '.join(SPLITS)}")
    splits.update({k: str(v) for k, v in given.items()})
    return splits


def load_hub_splits(
    path: str, name: str | None, *, splits: dict[str, str], revision, data_dir, data_files, where: str, local_files: str
) -> dict[str, Any]:
    """{our split: datasets.Dataset} of a hub (or local, e.g. "parquet" + data_files) dataset.

    `local_files`: the overrides that read local files instead, named in the message when the hub
    cannot be reached and nothing is cached.
    """
    import datasets
    import datasets.config

    label = hub_label(path, name)
    local = _is_local(path)
    offline = bool(datasets.config.HF_HUB_OFFLINE)
    if not local and not offline and not _proxy_configured():
        # A proxy may reach the hub where a direct connection cannot, so only probe without one.
        offline = not hub_reachable()
        if offline:
            logger.info("%s: the Hugging Face hub is unreachable; looking for %s in the local cache only", where, label)
    unavailable = (
        f"{where}: cannot download {label} from the Hugging Face hub (offline?) and it is not in the local cache "
        f"({datasets.config.HF_DATASETS_CACHE}); download it once with network access (it is then cached), "
        f"or use local files: {local_files}"
    )
    start = time.perf_counter()
    try:
        with _hub_offline(offline and not local):
            loaded = datasets.load_dataset(path, name, revision=revision, data_dir=data_dir, data_files=_plain(data_files))
    except (ConnectionError, TimeoutError) as err:
        logger.debug("%s: load_dataset failed after %.1fs: %s", where, time.perf_counter() - start, err)
        raise DataUnavailable(unavailable) from None
    except RuntimeError as err:
        if "scripts are no longer supported" in str(err):
            raise ConfigError(
                f"{where}: {label} is a script-based dataset, which datasets {datasets.__version__} cannot run; "
                f"try its parquet export (task.hf_revision=refs/convert/parquet task.hf_data_dir=<config name>) or use local files"
            ) from None
        raise ConfigError(f"{where}: cannot load {label}: {_squeezed(err)}") from None
    except (FileNotFoundError, ValueError) as err:
        if offline and "Couldn't find cache" in str(err):
            raise DataUnavailable(unavailable) from None  # cached, but another config than the one asked for
        raise ConfigError(f"{where}: cannot load {label}: {_squeezed(err)}") from None
    except Exception as err:
        if type(err).__name__ in ("DatasetNotFoundError", "DataFilesNotFoundError", "EmptyDatasetError"):
            raise ConfigError(f"{where}: cannot load {label}: {_squeezed(err)}; check task.hf_path / task.hf_name") from None
        raise

    out = {}
    for split, hub_split in splits.items():
        if hub_split not in loaded:
            raise ConfigError(
                f"{where}: {label} has no split {hub_split!r} for {split}; it has {', '.join(loaded)} (set task.hf_splits.{split})"
            )
        out[split] = loaded[hub_split]
    return out
