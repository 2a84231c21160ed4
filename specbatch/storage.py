"""Where a job's files live: a local folder or an object-store URL, behind one small interface.

A local folder keeps the POSIX commit protocol: a temporary file, fsync, `os.replace`, fsync of the
folder. An object store (any fsspec file system named by a URL: `s3://bucket/prefix`, `gs://...`,
`memory://...`) has no rename and no `flock`, but it has what a commit needs: an object is absent or
whole (a PUT, or a multipart upload, appears at once when it completes), so every write is its own
commit, and S3 takes a conditional PUT (`If-None-Match: *`, fsspec's `pipe_file(mode="create")`), the
one primitive the job's lease (`specbatch.job.lease`) needs.

Keys are relative to the job folder, with `/` separators (`results/part-w00-R-00000.parquet`).
Credentials and endpoints come from the file system's own settings (for S3: `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINT_URL`, or `FSSPEC_S3_*` variables); nothing here reads them.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from functools import cached_property
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

TMP_SUFFIX = ".tmp"
Location = str | os.PathLike


def is_url(location: Location) -> bool:
    """True for `scheme://...` other than `file://` (a local path either way)."""
    text = os.fspath(location)
    return "://" in text and not text.startswith("file://")


def join(location: Location, *names: str) -> str:
    """`location/name/...` for a path or a URL (`Path` would fold a URL's `//`)."""
    text = os.fspath(location)
    if not is_url(text):
        return str(Path(text.removeprefix("file://"), *names))
    return "/".join([text.rstrip("/"), *names])


def location_name(location: Location) -> str:
    """The last component: a job directory's name is its job id."""
    return os.fspath(location).rstrip("/").rsplit("/", 1)[-1]


def open_storage(location: Location) -> Storage:
    if is_url(location):
        return ObjectStorage(os.fspath(location))
    return LocalStorage(Path(os.fspath(location).removeprefix("file://")))


def open_input(location: Location) -> IO[bytes]:
    """A file (local path or URL) opened for reading bytes, with the full `io` API (fsspec's files
    lack `readline(size)`, which the JSONL reader's size limit needs)."""
    if not is_url(location):
        return open(os.fspath(location), "rb")  # noqa: SIM115 - the caller closes it
    fs, path = _url_to_fs(os.fspath(location))
    return io.BufferedReader(fs.open(path, "rb"), buffer_size=1 << 20)


def input_exists(location: Location) -> bool:
    if not is_url(location):
        return Path(os.fspath(location)).exists()
    fs, path = _url_to_fs(os.fspath(location))
    return bool(fs.exists(path))


class StaleWriteError(RuntimeError):
    """A conditional write found its object changed since it was read: another runner wrote it."""


class LinkInJobError(OSError):
    """A symbolic link inside a local job folder: nothing a job writes or deletes may follow one out."""


def links_in(root: Path, folders: Iterable[str]) -> list[Path]:
    """Symbolic links directly in `root` or in its `folders` (not followed), sorted; [] if none. A
    job folder with any is refused: its links could lead a write or a delete out of it."""
    if not root.is_dir():
        return []
    found: list[Path] = []
    inner_folders = set(folders)
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.is_symlink():
                found.append(Path(entry.path))
            elif entry.name in inner_folders and entry.is_dir(follow_symlinks=False):
                with os.scandir(entry.path) as inner:
                    found += [Path(e.path) for e in inner if e.is_symlink()]
    return sorted(found)


def open_no_follow(path: Path, flags: int, mode: int = 0o644) -> int:
    """`os.open` that refuses a link at `path` with `LinkInJobError`: a symbolic link (O_NOFOLLOW),
    or a hard link (a file with more than one name, checked on the open descriptor before anything
    is written), whose other name may be any file of the user's outside the job."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as error:
        if path.is_symlink():
            raise LinkInJobError(f"{path} is a symbolic link; a job folder must not contain links "
                                 "(remove it and run again)") from error
        raise
    num_links = os.fstat(fd).st_nlink
    if num_links > 1:
        os.close(fd)
        raise LinkInJobError(f"{path} is a hard link ({num_links} names for one file); a job folder must not "
                             "contain links (remove it and run again)")
    return fd


class Storage:
    """A job folder: atomic whole-object writes, create-if-absent, listing, deletes, Parquet."""

    location: str  # as the user gave it: a path or a URL
    is_local: bool

    @property
    def name(self) -> str:
        return location_name(self.location)

    def url(self, key: str = "") -> str:
        return join(self.location, *[part for part in key.split("/") if part])

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    def names(self, folder: str, suffix: str = "") -> list[str]:
        """Names (not keys) of the files directly in `folder` ending with `suffix`, sorted; [] if none."""
        raise NotImplementedError

    def sizes(self, folder: str, suffix: str = "") -> dict[str, int]:
        """Size in bytes of each file `names(folder, suffix)` lists, from the listing itself."""
        raise NotImplementedError

    def read_bytes(self, key: str) -> bytes:
        """The object's bytes; `FileNotFoundError` if it does not exist."""
        raise NotImplementedError

    def version(self, key: str) -> str | None:
        """An opaque tag that changes whenever `key` is written (an object's ETag); None if it is absent."""
        raise NotImplementedError

    def write_if(self, key: str, data: bytes, version: str | None) -> bool:
        """Write `key` whole only if its version is still `version` (None: only if it is still absent);
        False, writing nothing, if another writer changed it since that version was read."""
        raise NotImplementedError

    def move(self, key: str, new_key: str) -> None:
        """Move `key` to `new_key` (a rename on a disk, a copy and a delete on an object store)."""
        raise NotImplementedError

    def read_text(self, key: str) -> str:
        return self.read_bytes(key).decode("utf-8")

    @contextmanager
    def open_write(self, key: str, durable: bool = True) -> Iterator[IO[bytes]]:
        """Write a whole object; readers see it only once the block ends without an error."""
        raise NotImplementedError
        yield  # pragma: no cover

    def write_bytes(self, key: str, data: bytes, durable: bool = True) -> None:
        with self.open_write(key, durable) as file:
            file.write(data)

    def create(self, key: str, data: bytes) -> bool:
        """Write `key` only if it does not exist yet (atomically); False if it already did."""
        raise NotImplementedError

    def delete(self, key: str) -> None:
        """Remove `key`; nothing if it is already gone."""
        raise NotImplementedError

    def write_parquet(self, key: str, table: pa.Table, durable: bool = True) -> None:
        with self.open_write(key, durable) as file:
            pq.write_table(table, file)

    def read_parquet(self, key: str, columns: list[str] | None = None, schema: pa.Schema | None = None) -> pa.Table:
        raise NotImplementedError

    def local_dir(self) -> Path:
        """A local folder for what only one machine needs (logs, compiled kernels): the job folder
        itself when it is local, else a folder under the system's temporary directory."""
        raise NotImplementedError


class LocalStorage(Storage):
    is_local = True

    def __init__(self, root: Path) -> None:
        self.root = root
        self.location = str(root)

    def _path(self, key: str) -> Path:
        """`root/key`, refusing a symbolic link among its folders (a write or delete through it would
        land outside the job)."""
        path = self.root
        for name in [part for part in key.split("/") if part][:-1]:
            path = path / name
            if path.is_symlink():
                raise LinkInJobError(f"{path} is a symbolic link; a job folder must not contain links "
                                     "(remove it and run again)")
        return self.root / key

    def exists(self, key: str) -> bool:
        return (self.root / key).exists()

    def names(self, folder: str, suffix: str = "") -> list[str]:
        directory = self._path(f"{folder}/-").parent
        if not directory.is_dir():
            return []
        return sorted(p.name for p in directory.iterdir() if p.name.endswith(suffix) and p.is_file())

    def sizes(self, folder: str, suffix: str = "") -> dict[str, int]:
        directory = self._path(f"{folder}/-").parent
        if not directory.is_dir():
            return {}
        with os.scandir(directory) as entries:
            return {e.name: e.stat(follow_symlinks=False).st_size for e in entries
                    if e.name.endswith(suffix) and e.is_file(follow_symlinks=False)}

    def read_bytes(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def version(self, key: str) -> str | None:
        try:
            stat = os.stat(self._path(key), follow_symlinks=False)
        except FileNotFoundError:
            return None
        return f"{stat.st_ino}-{stat.st_size}-{stat.st_mtime_ns}"

    def write_if(self, key: str, data: bytes, version: str | None) -> bool:
        """Compared, then written: one runner holds a local job (its flock), so nothing writes between."""
        if self.version(key) != version:
            return False
        self.write_bytes(key, data)
        return True

    def move(self, key: str, new_key: str) -> None:
        target = self._path(new_key)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._path(key), target)

    @contextmanager
    def open_write(self, key: str, durable: bool = True) -> Iterator[IO[bytes]]:
        """A temporary file beside the target, renamed over it; with `durable`, the file and then the
        folder are fsynced, so the rename survives power loss too."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + TMP_SUFFIX)
        tmp.unlink(missing_ok=True)  # a stale one, or a planted link: the link goes, not what it names
        try:
            with os.fdopen(open_no_follow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as file:
                yield file
                if durable:
                    file.flush()
                    os.fsync(file.fileno())
            os.replace(tmp, path)
        except Exception:  # a kill leaves the .tmp file instead; the ledger removes such orphans on resume
            tmp.unlink(missing_ok=True)
            raise
        if durable:
            fsync_dir(path.parent)

    def create(self, key: str, data: bytes) -> bool:
        """Written under a unique temporary name, then hard-linked to `key`: `link` fails if `key`
        exists, so the content appears whole or not at all."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        fsync_dir(path.parent)
        return True

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)  # a link itself goes, never what it names

    def read_parquet(self, key: str, columns: list[str] | None = None, schema: pa.Schema | None = None) -> pa.Table:
        return pq.read_table(self.root / key, columns=columns, schema=schema)

    def local_dir(self) -> Path:
        return self.root


class ObjectStorage(Storage):
    """An fsspec file system. Listings are read fresh (fsspec caches them per instance, and other
    machines write here too)."""

    is_local = False

    def __init__(self, url: str) -> None:
        self.location = url.rstrip("/")
        self.fs, self.root = _url_to_fs(self.location)

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    def exists(self, key: str) -> bool:
        self.fs.invalidate_cache(self._path(key))
        return bool(self.fs.exists(self._path(key)))

    def names(self, folder: str, suffix: str = "") -> list[str]:
        path = self._path(folder)
        self.fs.invalidate_cache(path)
        try:
            entries = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return []
        names = (entry["name"].rstrip("/").rsplit("/", 1)[-1] for entry in entries if entry["type"] == "file")
        return sorted(name for name in names if name.endswith(suffix))

    def sizes(self, folder: str, suffix: str = "") -> dict[str, int]:
        path = self._path(folder)
        self.fs.invalidate_cache(path)
        try:
            entries = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return {}
        sizes = {entry["name"].rstrip("/").rsplit("/", 1)[-1]: int(entry.get("size") or 0)
                 for entry in entries if entry["type"] == "file"}
        return {name: size for name, size in sizes.items() if name.endswith(suffix)}

    def read_bytes(self, key: str) -> bytes:
        return bytes(self.fs.cat_file(self._path(key)))

    def version(self, key: str) -> str | None:
        self.fs.invalidate_cache(self._path(key))
        try:
            info = self.fs.info(self._path(key))
        except FileNotFoundError:
            return None
        tag = info.get("ETag") or info.get("etag") or info.get("generation") or info.get("md5Hash")
        changed = info.get("LastModified") or info.get("mtime") or info.get("created")
        return str(tag) if tag else f"{info.get('size')}-{changed}"

    def write_if(self, key: str, data: bytes, version: str | None) -> bool:
        """On S3 one conditional PUT (`If-Match: ETAG`, or `If-None-Match: *` for an absent key), so a
        writer that lost a race never replaces the winner's object. A file system without conditional
        PUTs is compared, then written (a race between the two remains there)."""
        if version is None:
            return self.create(key, data)
        if _protocols(self.fs) & {"s3", "s3a"}:
            try:
                # one PUT up to S3's 5 GB limit (a multipart upload would not carry the condition)
                self.fs.pipe_file(self._path(key), data, chunksize=max(50 << 20, len(data)), IfMatch=version)
            except OSError as error:
                if _is_precondition_failure(error):
                    return False
                raise
            finally:
                self.fs.invalidate_cache(self._path(key))
            return True
        if self.version(key) != version:
            return False
        self.write_bytes(key, data)
        return True

    def move(self, key: str, new_key: str) -> None:
        self.fs.copy(self._path(key), self._path(new_key))
        self.delete(key)

    @contextmanager
    def open_write(self, key: str, durable: bool = True) -> Iterator[IO[bytes]]:
        """Buffered locally, then one upload: the object appears when the upload completes, and an
        error before that leaves no object (`durable` is implied)."""
        with tempfile.SpooledTemporaryFile(max_size=64 << 20) as buffer:
            yield buffer
            buffer.seek(0)
            with self.fs.open(self._path(key), "wb") as remote:
                shutil.copyfileobj(buffer, remote, 8 << 20)

    def create(self, key: str, data: bytes) -> bool:
        try:
            self.fs.pipe_file(self._path(key), data, mode="create")
        except FileExistsError:
            return False
        return True

    def delete(self, key: str) -> None:
        with suppress(FileNotFoundError):
            self.fs.rm_file(self._path(key))
        self.fs.invalidate_cache(self._path(key))

    def read_parquet(self, key: str, columns: list[str] | None = None, schema: pa.Schema | None = None) -> pa.Table:
        """The file fetched whole on this thread, then parsed from memory. Handing pyarrow the fsspec
        file system instead lets its I/O threads call back into Python, and one still running at
        interpreter exit aborts the process ("terminate called without an active exception",
        apache/arrow#39162); part files are small, so nothing is lost by fetching them whole."""
        return pq.read_table(pa.BufferReader(self.read_bytes(key)), columns=columns, schema=schema)

    def local_dir(self) -> Path:
        return self._scratch

    @cached_property
    def _scratch(self) -> Path:
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in self.location)
        path = Path(tempfile.gettempdir()) / "specbatch" / safe
        path.mkdir(parents=True, exist_ok=True)
        return path


def _protocols(fs: Any) -> set[str]:
    protocol = fs.protocol
    return set(protocol) if isinstance(protocol, (tuple, list)) else {protocol}


def _is_precondition_failure(error: OSError) -> bool:
    """s3fs raises a failed `If-Match` as an `OSError` (EINVAL) whose cause is botocore's 412."""
    cause = error.__cause__
    response = getattr(cause, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    return code in ("PreconditionFailed", "412") or "PreconditionFailed" in str(error) or "412" in str(cause)


def _url_to_fs(url: str) -> tuple[Any, str]:
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    return fs, path.rstrip("/")


def fsync_dir(path: Path) -> None:
    """Make a rename or new file in `path` durable (POSIX needs the folder itself synced)."""
    fsync_path(path)


def fsync_path(path: Path) -> None:
    """Flush a file's or folder's contents to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
