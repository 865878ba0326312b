"""The memory page (`remat._report._memory_html`) rendered by a real browser: headless
Chromium takes a screenshot, and the plot's colours must be on it.

Skipped when no Chromium is installed (Debian: ``apt-get install -y chromium``): the page
needs a browser to be checked as a person sees it, and none ships with Python.
"""

from __future__ import annotations

import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat
from remat._report._memory_html import memory_html
from remat._report._memory_plot import COLORS

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def loss(ws, x):
    h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)
    return jnp.sum(h**2)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    args = jnp.ones((8, 64, 64)) * 0.01, jnp.ones((256, 64))
    views = [remat.memory(loss, *args), remat.memory(loss, *args, strategy="full")]
    return memory_html(views, tmp_path_factory.mktemp("page") / "memory.html"), views


def test_every_kind_has_a_colour():
    from remat._measure._memory import KINDS

    assert set(COLORS) == set(KINDS)


def test_the_page_is_self_contained(page):
    path, views = page
    text = path.read_text()
    assert "http://" not in text and "https://" not in text and "<script" not in text
    assert text.count("<svg") == 2
    # every drawn column has a hover text with its position and bytes
    assert "position " in text and "<title>" in text
    assert f"peak {views[1].peak_bytes / 2**20:.1f} MiB" in text


@pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium to render the page (apt-get install chromium)"
)
def test_chromium_renders_the_plot(page, tmp_path):
    import matplotlib.image

    path, _ = page
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", f"--screenshot={shot}",
            "--window-size=1400,900", path.as_uri(),
        ],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    pixels = (matplotlib.image.imread(shot)[..., :3] * 255).round().astype(int)

    def share(color: str) -> float:
        rgb = np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)])
        # the areas are drawn at 85% opacity over white
        seen = (0.85 * rgb + 0.15 * 255).round()
        return float((np.abs(pixels - seen).max(axis=-1) <= 3).mean())

    assert share(COLORS["saved"]) > 0.01  # the saved residuals fill a large area
    assert share(COLORS["parameter"]) > 0.001
