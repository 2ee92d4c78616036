"""The local images are cached by the hash of their inputs: building again rebuilds nothing, and a
changed input changes the tag of its image (and of the images built from it), nothing else."""

from __future__ import annotations

import pytest

from deploy import images
from deploy.stack import Endpoints

pytestmark = [pytest.mark.integration, pytest.mark.containers_only]


def test_second_build_rebuilds_nothing(stack: Endpoints) -> None:
    # ``stack`` first: it built the stack's images (or found them cached); then every image, once.
    assert stack.containers is not None
    images.ensure_images(images.ALL_IMAGES, log=lambda _: None)
    again = images.ensure_images(images.ALL_IMAGES, log=lambda _: None)
    assert [name for name, b in again.items() if b.built] == []
    assert {name: again[name].tag for name in ("base", *images.STACK_IMAGES)} == stack.containers.images


def test_image_tag_follows_its_inputs() -> None:
    before = images.ensure_images(images.ALL_IMAGES, log=lambda _: None)
    python = images.RECIPES["python"]
    changed = images.Recipe(python.name, python.containerfile, python.parent,
                            lambda: {**python.inputs(), "extra.txt": b"changed"}, python.prepare)  # fmt: skip
    digest = images._digest(changed, before["base"].tag, changed.inputs())
    assert f"{images.REPOSITORY}python:{digest}" != before["python"].tag
    unchanged = images._digest(python, before["base"].tag, python.inputs())
    assert f"{images.REPOSITORY}python:{unchanged}" == before["python"].tag
