"""Layers: GPLayer and DenseLayer with the weight-induced kernel (docs/algorithms.md,
"BNNs as deep GPs")."""

import numpy as np
import pytest
import tensorflow_probability as tfp

from deepgp_gi.kernels import WeightKernel, batched_K, batched_K_diag, batched_K_sym
from deepgp_gi.layers import DenseLayer

tfd = tfp.distributions


def test_weight_kernel_is_feature_inner_product(rng):
    kern = WeightKernel(3, "relu", bias=True)
    F = rng.normal(size=(2, 5, 3))
    G = rng.normal(size=(2, 4, 3))
    Phi_F = np.concatenate([np.maximum(F, 0), np.ones((2, 5, 1))], -1)
    Phi_G = np.concatenate([np.maximum(G, 0), np.ones((2, 4, 1))], -1)
    np.testing.assert_allclose(kern.features(F), Phi_F)
    np.testing.assert_allclose(
        batched_K(kern, F, G), Phi_F @ Phi_G.transpose(0, 2, 1) / 4, rtol=1e-12
    )
    np.testing.assert_allclose(
        batched_K_sym(kern, F), Phi_F @ Phi_F.transpose(0, 2, 1) / 4, rtol=1e-12
    )
    np.testing.assert_allclose(batched_K_diag(kern, F), (Phi_F**2).sum(-1) / 4, rtol=1e-12)
    np.testing.assert_allclose(kern(F[0], G[0]), Phi_F[0] @ Phi_G[0].T / 4, rtol=1e-12)
    with pytest.raises(ValueError, match="3 columns"):
        kern.features(rng.normal(size=(4, 5)))
    # Standard prior: K = Phi Phi^T; Scale prior: E[1/s] = 2 for Gamma(2, 2).
    assert DenseLayer(3, 2, prior="standard").kernel.weight_variance == 1.0
    np.testing.assert_allclose(DenseLayer(3, 2, prior="scale").kernel.weight_variance, 2.0 / 4)
    layer = DenseLayer(3, 2, activation="tanh")
    assert (layer.input_dim, layer.output_dim, layer.fan_in, layer.inducing_variable) == (
        3,
        2,
        4,
        None,
    )
    np.testing.assert_array_equal(layer.mean(F), np.zeros((2, 5, 2)))


def test_layer_kinds_are_classes_not_attributes():
    """The posteriors and the network walk tell layers apart by their base classes: an object
    with a weighted layer's attributes is not a weighted layer, nor a layer at all."""
    import gpflow

    from deepgp_gi.layers import (
        Conv2DLayer,
        Flatten,
        GPLayer,
        Layer,
        WeightedLayer,
        check_layer_chain,
        is_convolution,
        is_weighted,
    )
    from deepgp_gi.posteriors.weight_space import has_feature_map

    class LooksWeighted:
        input_dim, output_dim, fan_in, prior, kernel_size = 3, 2, 4, None, 3

        def features(self, F):
            return F

        def gram(self, U, precision):
            return U

    dense, conv = DenseLayer(3, 2), Conv2DLayer((4, 4, 1), 2)
    gp = GPLayer(gpflow.kernels.SquaredExponential(), 2, 3)
    assert all(isinstance(layer, WeightedLayer) for layer in (dense, conv))
    assert all(isinstance(layer, Layer) for layer in (dense, conv, gp, Flatten((4, 4, 2))))
    assert [has_feature_map(x) for x in (dense, conv, gp, LooksWeighted())] == [
        True,
        True,
        False,
        False,
    ]
    assert [is_weighted(x) for x in (dense, conv, gp, LooksWeighted())] == [
        True,
        True,
        False,
        False,
    ]
    assert [is_convolution(x) for x in (dense, conv, LooksWeighted())] == [False, True, False]
    with pytest.raises(TypeError, match="not a deepgp_gi layer"):
        check_layer_chain([LooksWeighted()])
