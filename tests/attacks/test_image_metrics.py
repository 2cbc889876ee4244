"""Image metrics of the gradient-inversion attacks: conventions (per-image PSNR mean, [0, 1] range,
Hungarian matching), agreement with scikit-image, and the PNG grid."""

import math

import numpy as np
import pytest
import torch
from skimage.metrics import structural_similarity

from dpeval.attacks import image_metrics as im


def images(b=3, c=1, h=8, w=8, seed=0):
    return torch.rand(b, c, h, w, generator=torch.Generator().manual_seed(seed))


def test_known_offsets_give_exact_mse_and_psnr():
    x = torch.full((1, 1, 8, 8), 0.5)
    metrics, _ = im.score(x, x + 0.1)
    assert metrics["mse"] == pytest.approx(0.01, rel=1e-6)
    assert metrics["psnr"] == pytest.approx(20.0, abs=1e-5)


def test_psnr_is_the_mean_of_per_image_psnrs():
    x = torch.stack([torch.full((1, 8, 8), 0.2), torch.full((1, 8, 8), 0.7)])
    rec = x.clone()
    rec[0] += 0.1   # 20 dB
    rec[1] += 0.01  # 40 dB
    metrics, perm = im.score(x, rec)
    assert list(perm) == [0, 1]
    assert metrics["psnr"] == pytest.approx(30.0, abs=1e-4)
    # not the PSNR of the mean MSE (that would be about 23 dB)
    assert metrics["psnr"] - 10 * math.log10(1 / metrics["mse"]) > 5


def test_identical_images_are_capped_at_100_db():
    x = images()
    metrics, _ = im.score(x, x.clone())
    assert metrics["psnr"] == pytest.approx(100.0)
    assert metrics["ssim"] == pytest.approx(1.0)
    assert metrics["mse"] == 0.0
    assert all(math.isfinite(v) for v in metrics.values())


def test_hungarian_matching_undoes_a_permutation():
    x = images(b=5)
    order = torch.tensor([3, 0, 4, 1, 2])
    metrics, perm = im.score(x, x[order])
    assert metrics["psnr"] == pytest.approx(100.0)
    # reconstructions[perm[i]] is matched with originals[i]
    assert torch.equal(order[torch.as_tensor(perm)], torch.arange(5))


def test_matching_is_optimal_not_greedy():
    # Costs (MSE): o0-r0 0, o0-r1 0.16, o1-r0 0.01, o1-r1 0.25. Greedy takes the free pair o0-r0 and
    # is left with o1-r1 (total 0.25); the assignment optimum is o0-r1 + o1-r0 (total 0.17).
    x = torch.stack([torch.full((1, 4, 4), v) for v in (0.5, 0.4)])
    rec = torch.stack([torch.full((1, 4, 4), v) for v in (0.5, 0.9)])
    assert list(im.match(x, rec)) == [1, 0]
    assert im.score(x, rec)[0]["mse"] == pytest.approx((0.16 + 0.01) / 2)


def test_ssim_agrees_with_scikit_image_for_rgb():
    x, r = images(b=1, c=3, h=16, w=16, seed=1), images(b=1, c=3, h=16, w=16, seed=2)
    expected = structural_similarity(x[0].double().numpy(), r[0].double().numpy(), data_range=1.0, channel_axis=0)
    assert im.score(x, r)[0]["ssim"] == pytest.approx(expected, abs=1e-9)


def test_small_images_shrink_the_ssim_window():
    x = images(b=1, h=5, w=5)
    ssim = im.score(x, x * 0.9)[0]["ssim"]
    assert 0 < ssim < 1


def test_reconstructions_are_clamped_to_the_pixel_range():
    x = torch.ones(1, 1, 8, 8)
    metrics, _ = im.score(x, x + 5.0)  # clamped back to 1 -> exact
    assert metrics["psnr"] == pytest.approx(100.0)


def test_baselines_are_low():
    x = images(b=2)
    base = im.baselines(x, (0.5,), torch.Generator().manual_seed(123))
    assert 0 < base["baseline_psnr_noise"] < 12
    assert 0 < base["baseline_psnr_mean"] < 15


def test_grid_png_has_originals_over_reconstructions(tmp_path):
    import matplotlib.image as mpimg

    x = images(b=3, c=3, h=8, w=8)
    path = im.save_grid(x, 1 - x, tmp_path / "sub" / "grid.png", title="t", captions=["a", "b", "c"])
    assert path.is_file()
    pixels = mpimg.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert np.ptp(pixels[..., :3]) > 0.5  # not blank
