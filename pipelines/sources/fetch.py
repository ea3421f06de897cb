"""Where ``ingest`` reads the raw files: a local folder, the download cache, or a fresh download, always checked
against ``pipelines/sources.lock.json``.

Every raw file is a byte-for-byte copy of a file of a public GitHub repository at a pinned commit
(:data:`ORIGINS`: local prefix -> repository, commit, path there), so it can be fetched from
``<base>/<owner>/<repo>/<commit>/<path>`` with ``base`` = :data:`GITHUB_RAW` (the default) or a mirror laid out the
same way (``ingest.mirror``; ``python -m ooospec.pipelines.sources.fetch mirror SRC DST`` lays one out from a
folder you have). ``ingest.source: auto`` resolves to (:func:`resolve_source`):

1. a local folder: ``$OOOSPEC_DATASETS``, else ``../shared/datasets`` when it exists (this workspace);
2. else the cache, ``$OOOSPEC_CACHE/datasets`` (default ``~/.cache/ooospec/datasets``), once every selected file is
   there and matches the lock;
3. else a download into that cache: one file at a time, into ``<file>.partial`` (resumed with an HTTP range
   request when the server allows it, restarted otherwise), checked against the lock, then renamed into place.
   A file whose bytes differ from the lock is refused (named, with the URL and both hashes) and never kept; an
   interrupted run leaves only ``.partial`` files, which the next run resumes.

The default six sources are 409 files, 54 MiB.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import shutil
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from tqdm import tqdm

GITHUB_RAW = "https://raw.githubusercontent.com"
DATASETS_ENV = "OOOSPEC_DATASETS"
WORKSPACE_DATASETS = Path("../shared/datasets")
_APIBANK = "AlibabaResearch/DAMO-ConvAI"
_APIBANK_TEST = "1d76900822d9ecfcd6e9eb0ca64a073cb892b735"     # test-data/ and training-data/ (deleted later upstream)
_APIBANK_HEAD = "483554eae102996f5ec1f4feab4e78ef29c2a394"
_GORILLA = "ShishirPatil/gorilla"
_BFCL_DATA = "berkeley-function-call-leaderboard/bfcl_eval/data/"

# (local prefix, repository, commit, path prefix there): the first prefix a file's local path starts with wins
ORIGINS: tuple[tuple[str, str, str, str], ...] = (
    ("apibank/raw/test-data/", _APIBANK, _APIBANK_TEST, "api-bank/test-data/"),
    ("apibank/raw/training-data/", _APIBANK, _APIBANK_TEST, "api-bank/training-data/"),
    ("apibank/raw/lv1-lv2-samples/", _APIBANK, _APIBANK_HEAD, "api-bank/lv1-lv2-samples/"),
    ("apibank/raw/init_database/", _APIBANK, _APIBANK_HEAD, "api-bank/init_database/"),
    ("apibank/raw/", _APIBANK, _APIBANK_HEAD, "api-bank/data/"),
    ("toolalpaca/raw/", "tangqiaoyu/ToolAlpaca", "189069998d64a7baf1b4a1c3c4b2e75eb9d05532", "data/"),
    ("bfcl/raw/BFCL_v2_", _GORILLA, "3f5ace7de63c37dc76d191f4471dfdb318c25f8e",
     "berkeley-function-call-leaderboard/data/BFCL_v2_"),
    ("bfcl/raw/possible_answer/BFCL_v2_", _GORILLA, "3f5ace7de63c37dc76d191f4471dfdb318c25f8e",
     "berkeley-function-call-leaderboard/data/possible_answer/BFCL_v2_"),
    ("bfcl/raw/BFCL_v3_", _GORILLA, "cd9429ccf3d4d04156affe883c495b3b047e6b64", _BFCL_DATA + "BFCL_v3_"),
    ("bfcl/raw/possible_answer/BFCL_v3_", _GORILLA, "cd9429ccf3d4d04156affe883c495b3b047e6b64",
     _BFCL_DATA + "possible_answer/BFCL_v3_"),
    ("bfcl/raw/", _GORILLA, "6ea57973c7a6097fd7c5915698c54c17c5b1b6c8", _BFCL_DATA),
    ("sealtools/raw/", "fairyshine/Seal-Tools", "ce753ecd60ed08dd376984035de531ab8421f1c6", "Seal-Tools_Dataset/"),
    ("glaive_toolcall/raw/", "hiyouga/LLaMA-Factory", "ff6d4d12eeb035d6ce06805a5733dd7b29f2ac30", "data/"),
    ("toolrl/raw/", "qiancheng0/ToolRL", "8cee13ec0ca72f0461da372a93a6fd8140dbb840", "dataset/rlla_4k_raw/"),
)


class SourceError(RuntimeError):
    """A raw file that cannot be had as locked (named in the message)."""


def origin(local: str) -> tuple[str, str, str]:
    """``(repository, commit, path)`` of a raw file's local path (``bfcl/raw/BFCL_v4_simple_python.json``)."""
    for prefix, repo, commit, upstream in ORIGINS:
        if local.startswith(prefix):
            return repo, commit, upstream + local[len(prefix):]
    raise SourceError(f"{local}: no upstream origin known for this path (pipelines/sources/fetch.py ORIGINS)")


def url_of(local: str, base: str = GITHUB_RAW) -> str:
    repo, commit, path = origin(local)
    return f"{base.rstrip('/')}/{repo}/{commit}/{urllib.request.quote(path)}"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def selected(lock: dict[str, str], folders: Iterable[str]) -> dict[str, str]:
    """The lock's entries under the selected sources' folders (``apibank/raw``, ...)."""
    prefixes = tuple(f.rstrip("/") + "/" for f in folders)
    return {k: v for k, v in sorted(lock.items()) if k.startswith(prefixes)}


def complete(root: Path, files: dict[str, str]) -> bool:
    """Every file present under ``root`` with its locked sha256."""
    return all((root / k).is_file() and sha256_of(root / k) == v for k, v in files.items())


def download_file(url: str, dest: Path, sha256: str, timeout: float = 60.0) -> None:
    """``url`` -> ``dest`` through ``dest.partial`` (resumed when the server honours a range), checked against
    ``sha256`` before the rename; a mismatch deletes the partial file and raises :class:`SourceError`."""
    part = dest.with_name(dest.name + ".partial")
    dest.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.is_file() else 0
    req = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            mode = "ab" if have and resp.status == 206 else "wb"   # 200 to a range request: start over
            expected, got = resp.headers.get("Content-Length"), 0
            with part.open(mode) as f:
                while block := resp.read(1 << 20):
                    f.write(block)
                    got += len(block)
            if expected is not None and got < int(expected):      # the connection closed early
                raise http.client.IncompleteRead(b"", int(expected) - got)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:          # the partial file is already whole: check it below
            pass
        else:
            raise SourceError(f"{dest.name}: {url} answered HTTP {e.code}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:   # cut short: keep the partial
        raise SourceError(f"{dest.name}: download from {url} failed ({e}); run again to resume") from None
    got = sha256_of(part)
    if got != sha256:
        part.unlink()
        raise SourceError(f"{dest.name}: the bytes from {url} do not match the lock (sha256 {got[:12]}... != locked "
                          f"{sha256[:12]}...); refused, nothing kept")
    part.replace(dest)


def download(files: dict[str, str], dest: Path, base: str = GITHUB_RAW) -> Path:
    """Every ``files`` entry (local path -> sha256) into ``dest``; files already there and matching are kept."""
    todo = {k: v for k, v in files.items() if not ((dest / k).is_file() and sha256_of(dest / k) == v)}
    for local, sha in tqdm(todo.items(), desc=f"download raw files ({len(todo)} of {len(files)})", unit="file"):
        download_file(url_of(local, base), dest / local, sha)
    return dest


def local_folder(env: dict | None = None) -> Path | None:
    """``$OOOSPEC_DATASETS``, else ``../shared/datasets`` when it is a folder, else None."""
    env = os.environ if env is None else env
    if env.get(DATASETS_ENV):
        return Path(env[DATASETS_ENV])
    return WORKSPACE_DATASETS if WORKSPACE_DATASETS.is_dir() else None


def resolve_source(source: str, files: dict[str, str], *, cache: Path, mirror: str | None = None) -> Path:
    """The folder ``ingest`` reads (module docstring): ``source`` itself unless it is ``"auto"``."""
    if source != "auto":
        return Path(source)
    found = local_folder()
    if found is not None:
        return found
    if not complete(cache, files):
        print(f"ingest.source auto: no local datasets folder (${DATASETS_ENV}); downloading {len(files)} raw files "
              f"into {cache} from {mirror or GITHUB_RAW}", file=sys.stderr)
        download(files, cache, mirror or GITHUB_RAW)
    return cache


def make_mirror(src: Path, dst: Path, files: dict[str, str]) -> int:
    """Lay ``src``'s raw files out as ``dst/<owner>/<repo>/<commit>/<path>`` (what :func:`url_of` asks a mirror
    for), e.g. to serve with ``python -m http.server``. Returns the number of files copied."""
    for local in files:
        repo, commit, path = origin(local)
        out = dst / repo / commit / path
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / local, out)
    return len(files)


def main(argv: list[str] | None = None) -> int:
    import json

    from ooospec.pipelines import sources as source_registry
    from ooospec.runtime.paths import cache_dir

    lock = json.loads(Path(__file__).parent.with_name("sources.lock.json").read_text())
    files = selected(lock, (folder for _, folder in source_registry.SOURCES.values()))
    p = argparse.ArgumentParser(prog="python -m ooospec.pipelines.sources.fetch", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("download", help="download every locked raw file (resumable)")
    d.add_argument("--dest", type=Path, default=None, help="default: $OOOSPEC_CACHE/datasets")
    d.add_argument("--mirror", default=GITHUB_RAW)
    m = sub.add_parser("mirror", help="lay out a datasets folder as a mirror (<owner>/<repo>/<commit>/<path>)")
    m.add_argument("src", type=Path)
    m.add_argument("dst", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "download":
        dest = download(files, args.dest or cache_dir() / "datasets", args.mirror)
        print(f"{len(files)} raw files in {dest}")
    else:
        print(f"{make_mirror(args.src, args.dst, files)} files laid out under {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
