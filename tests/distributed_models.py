"""The small models and data of the tf.distribute check scripts (``distributed_options_check.py``,
``distributed_multiworker_check.py``; imported after each script has set up its devices or its
strategy): 21 regression rows and 16 8x8 images, a depth-2 deep GP, a dense BNN and a LeNet BNN,
each builder returning ``(model, data)``."""

import numpy as np

import deepgp_gi as dg

rng = np.random.default_rng(0)
X = rng.normal(size=(21, 2))
Y = np.sin(X[:, :1]) + 0.1 * rng.normal(size=(21, 1))
images = rng.normal(size=(16, 8, 8, 1))
image_labels = rng.integers(0, 3, size=(16, 1)).astype(float)


def deep_gp(posterior="mean_field", **options):
    return dg.build_deep_gp(
        X, Y, depth=2, posterior=posterior, num_inducing=5, inner_width=2, seed=0, **options
    ), (X, Y)


def bnn():
    return dg.build_bnn(X, Y, hidden=(4,), posterior="global", num_inducing=5, seed=0), (X, Y)


def conv_bnn():
    return dg.build_conv_bnn(
        images,
        image_labels,
        architecture="lenet",
        posterior="global",
        num_inducing=4,
        channels=(2, 2),
        hidden=(6,),
        seed=0,
    ), (images, image_labels)
