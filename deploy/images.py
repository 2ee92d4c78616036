"""Local container images for the containers backend, built from Debian's packages and cached.

No image can be pulled here, so every image starts from a base made on this machine: a minimal Debian
root filesystem (``debootstrap --variant=minbase``, trimmed) brought in with ``podman import``. The
others are ``podman build --from <base>`` of a Containerfile in ``deploy/images/``:

=========  ===================================================================================
base       Debian (bookworm, minbase), no docs, no recommends
kafka      + openjdk-17-jre-headless, + the Kafka jars of ``deploy/kafka-pom.xml`` (the same cache
           as the processes backend), + ``kafka-run.sh`` (format on first start, run the broker)
minio      + the MinIO binary ``deploy/minio.py`` builds
etcd       + Debian's etcd-server
python     + Debian's python3 in a virtualenv with the sidecar's dependencies from pyproject.toml
sidecar    ``deploy/Containerfile`` itself (the user's image) built ``--from`` the python image
=========  ===================================================================================

Caching: an image's tag is a hash of everything it is built from (its Containerfile, every file of
its build context, its parent's tag), so ``podman image exists`` on that tag decides: an image is
rebuilt only when one of its inputs changed, and a change to a parent rebuilds its children.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from deploy import kafka, minio, podman
from deploy.errors import StackError
from tiering_core.cache import cache_dir

REPOSITORY = "localhost/tiering-"
RECIPES_DIR = Path(__file__).with_name("images")
SOURCE_ROOT = Path(__file__).resolve().parent.parent
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = os.environ.get("TIERING_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BUILD_TIMEOUT = 1800.0

# Run in the debootstrapped root filesystem before it is imported: leaner images, and package
# installs in later builds that neither start services nor keep docs, man pages or downloaded .debs.
SLIM_BASE = f"""\
set -eu
cat > etc/apt/sources.list <<EOF
deb {DEBIAN_MIRROR} {DEBIAN_SUITE} main
deb {DEBIAN_MIRROR} {DEBIAN_SUITE}-updates main
deb {DEBIAN_MIRROR.replace("/debian", "/debian-security")} {DEBIAN_SUITE}-security main
EOF
printf 'APT::Install-Recommends "false";\\nAPT::Install-Suggests "false";\\n' > etc/apt/apt.conf.d/01-tiering
printf 'Dpkg::Options {{"--force-confold";}};\\nAPT::Get::Assume-Yes "true";\\n' >> etc/apt/apt.conf.d/01-tiering
printf 'DPkg::Post-Invoke {{"rm -f /var/cache/apt/archives/*.deb";}};\\n' >> etc/apt/apt.conf.d/01-tiering
printf 'path-exclude=/usr/share/doc/*\\npath-include=/usr/share/doc/*/copyright\\n' > etc/dpkg/dpkg.cfg.d/01-tiering
printf 'path-exclude=/usr/share/man/*\\npath-exclude=/usr/share/locale/*\\n' >> etc/dpkg/dpkg.cfg.d/01-tiering
printf '#!/bin/sh\\nexit 101\\n' > usr/sbin/policy-rc.d && chmod 755 usr/sbin/policy-rc.d
find usr/share/doc -mindepth 1 -not -name copyright -not -type d -delete
# Empty, but there: postinst scripts (update-alternatives for java) link man pages into them.
find usr/share/man usr/share/locale -not -type d -delete
rm -rf var/lib/apt/lists/* var/cache/apt/* var/log/*.log
"""

Inputs = dict[str, Path | bytes]  # build-context path -> a file, a directory, or generated content


@dataclass(frozen=True)
class Recipe:
    """How to build one image: its Containerfile, its parent image and its build context."""

    name: str
    containerfile: Path
    parent: str
    inputs: Callable[[], Inputs]
    prepare: Callable[[Path], None] | None = None  # adds to the context what its inputs determine


@dataclass(frozen=True)
class Built:
    name: str
    tag: str
    built: bool
    seconds: float


def _kafka_inputs() -> Inputs:
    return {"libs": kafka.fetch_jars(), "kafka-run.sh": RECIPES_DIR / "kafka-run.sh"}


def _python_inputs() -> Inputs:
    project = tomllib.loads(_source_file("pyproject.toml").read_text())["project"]
    return {"requirements.txt": "".join(f"{dep}\n" for dep in project["dependencies"]).encode()}


def _download_wheels(context: Path) -> None:
    """Wheels for ``requirements.txt``, and for the build backend (``build-wheels``), made by the host's
    pip (downloaded, or built from an sdist by the same Python 3.11): inside a build PyPI may not be
    reachable the way the host reaches it (proxies, certificates)."""
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet"]
    log = _log_path("python-wheels")
    _run_logged([*pip, "-w", str(context / "wheels"), "-r", str(context / "requirements.txt")], log, "pip wheel")
    _run_logged([*pip, "-w", str(context / "build-wheels"), "setuptools>=68", "wheel"], log, "pip wheel", append=True)


def _sidecar_inputs() -> Inputs:
    """What ``deploy/Containerfile`` copies: the sources named by its COPY lines, from this checkout."""
    sources: list[str] = []
    for line in (RECIPES_DIR.parent / "Containerfile").read_text().splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0].upper() == "COPY":
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    return {src: _source_file(src) for src in sources}


def _source_file(relative: str) -> Path:
    path = SOURCE_ROOT / relative
    if not path.exists():
        raise StackError(f"{path} not found: the sidecar image is built from a source checkout of this project")
    return path


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("kafka", RECIPES_DIR / "kafka.Containerfile", "base", _kafka_inputs),
        Recipe("minio", RECIPES_DIR / "minio.Containerfile", "base", lambda: {"minio": minio.build_minio()}),
        Recipe("etcd", RECIPES_DIR / "etcd.Containerfile", "base", dict),
        Recipe("python", RECIPES_DIR / "python.Containerfile", "base", _python_inputs, _download_wheels),
        Recipe("sidecar", RECIPES_DIR.parent / "Containerfile", "python", _sidecar_inputs),
    )
}
STACK_IMAGES = ("kafka", "minio", "etcd")
ALL_IMAGES = ("base", *RECIPES)


def ensure_images(names: tuple[str, ...] = ALL_IMAGES, *, log: Callable[[str], None] = print) -> dict[str, Built]:
    """Build the named images (and their parents) unless cached; returns each one's tag and build time."""
    done: dict[str, Built] = {}
    for name in names:
        _ensure(name, done, log)
    return done


def _ensure(name: str, done: dict[str, Built], log: Callable[[str], None]) -> Built:
    if name in done:
        return done[name]
    if name == "base":
        result = _ensure_base(log)
    else:
        try:
            recipe = RECIPES[name]
        except KeyError:
            raise StackError(f"no image recipe {name!r}: the images are {', '.join(ALL_IMAGES)}") from None
        result = _ensure_recipe(recipe, _ensure(recipe.parent, done, log).tag, log)
    done[name] = result
    return result


def _exists(tag: str) -> bool:
    try:
        podman.run("image", "exists", tag, timeout=60)
    except StackError:
        return False
    return True


def _ensure_base(log: Callable[[str], None]) -> Built:
    digest = hashlib.sha256(f"{DEBIAN_SUITE}\n{DEBIAN_MIRROR}\n{SLIM_BASE}".encode()).hexdigest()[:16]
    tag = f"{REPOSITORY}base:{digest}"
    if _exists(tag):
        log(f"image base: cached ({tag})")
        return Built("base", tag, False, 0.0)
    if shutil.which("debootstrap") is None:
        raise StackError("debootstrap not found: apt-get install debootstrap (deploy/setup.sh does it)")
    started = time.monotonic()
    rootfs = cache_dir() / "images" / "base-rootfs"
    build_log = _log_path("base")
    shutil.rmtree(rootfs, ignore_errors=True)
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    try:
        _run_logged(
            ["debootstrap", "--variant=minbase", DEBIAN_SUITE, str(rootfs), DEBIAN_MIRROR], build_log, "debootstrap"
        )
        _run_logged(["sh", "-c", SLIM_BASE], build_log, "trimming the base root filesystem", cwd=rootfs)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            subprocess.run(
                [podman.podman_binary(), "import", "--change", "CMD /bin/bash", "-", tag],
                stdin=tar.stdout, capture_output=True, env=podman.engine_env(), timeout=600, check=True,
            )  # fmt: skip
        except subprocess.CalledProcessError as exc:
            raise StackError(f"podman import of the base image failed:\n{exc.stderr.decode()[-3000:]}") from exc
        finally:
            tar.wait(60)
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    return _report(Built("base", tag, True, time.monotonic() - started), log)


def _ensure_recipe(recipe: Recipe, parent_tag: str, log: Callable[[str], None]) -> Built:
    inputs = recipe.inputs()
    digest = _digest(recipe, parent_tag, inputs)
    tag = f"{REPOSITORY}{recipe.name}:{digest}"
    if _exists(tag):
        log(f"image {recipe.name}: cached ({tag})")
        return Built(recipe.name, tag, False, 0.0)
    started = time.monotonic()
    context = cache_dir() / "images" / f"context-{recipe.name}"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    try:
        for rel, source in inputs.items():
            _place(source, context / rel)
        if recipe.prepare is not None:
            recipe.prepare(context)
        cmd = [
            # --layers=false: the tag's hash decides what is rebuilt; podman's layer cache would not
            # see a change in what a RUN --mount reads, and intermediate layers would pile up.
            podman.podman_binary(), "build", "--layers=false", "--network", "host", "--from", parent_tag,
            "-f", str(recipe.containerfile), "-t", tag, "--label", f"tiering.inputs={digest}", str(context),
        ]  # fmt: skip
        _run_logged(cmd, _log_path(recipe.name), f"building the {recipe.name} image")
    finally:
        shutil.rmtree(context, ignore_errors=True)
    return _report(Built(recipe.name, tag, True, time.monotonic() - started), log)


def _report(built: Built, log: Callable[[str], None]) -> Built:
    log(f"image {built.name}: built in {built.seconds:.1f} s ({built.tag})")
    _prune(built)
    return built


def _prune(built: Built) -> None:
    """Remove the image's other (older) tags, so rebuilt images do not pile up; one still used by a
    container stays (podman refuses), as do its layers that newer images share."""
    repository = built.tag.rpartition(":")[0]
    listed = podman.run("images", "--format", "{{.Repository}}:{{.Tag}}", repository, timeout=60)
    for tag in set(listed.split()) - {built.tag}:
        with contextlib.suppress(StackError):
            podman.run("rmi", tag, timeout=120)


def _digest(recipe: Recipe, parent_tag: str, inputs: Inputs) -> str:
    h = hashlib.sha256()
    for part in (recipe.name, parent_tag, recipe.containerfile.read_text()):
        h.update(part.encode() + b"\0")
    for rel, source in sorted(inputs.items()):
        if isinstance(source, bytes):
            h.update(f"{rel}\0".encode() + hashlib.sha256(source).digest())
            continue
        for path in _files(source):
            name = rel if path == source else f"{rel}/{path.relative_to(source).as_posix()}"
            h.update(f"{name}\0{path.stat().st_mode & 0o111}\0".encode() + _file_digest(path))
    return h.hexdigest()[:16]


def _files(source: Path) -> Iterator[Path]:
    if source.is_file():
        yield source
        return
    for path in sorted(source.rglob("*")):
        if path.is_file() and not _ignored(path):
            yield path


def _ignored(path: Path) -> bool:
    return "__pycache__" in path.parts or path.suffix == ".pyc" or path.name.startswith(".")


def _file_digest(path: Path) -> bytes:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").digest()


def _place(source: Path | bytes, target: Path) -> None:
    """Put one input in the build context: hard links where possible (the jars, MinIO), else copies."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(source, bytes):
        target.write_bytes(source)
        return
    for path in _files(source):
        dest = target if path == source else target / path.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, dest)
        except OSError:
            shutil.copy2(path, dest)


def _log_path(name: str) -> Path:
    path = cache_dir() / "images" / f"{name}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _run_logged(cmd: list[str], log_file: Path, what: str, cwd: Path | None = None, append: bool = False) -> None:
    with log_file.open("a" if append else "w") as out:
        try:
            result = subprocess.run(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=podman.engine_env(), cwd=cwd,
                timeout=BUILD_TIMEOUT, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise StackError(f"{what} did not finish within {BUILD_TIMEOUT:.0f}s; see {log_file}") from exc
    if result.returncode != 0:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-30:])
        raise StackError(f"{what} failed (exit {result.returncode}); last lines of {log_file}:\n{tail}")
