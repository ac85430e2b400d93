"""The names the training flags accept, importable without torch (so that ``transdenoiser train --help`` and
its flag errors need not load torch). tests/test_cli_behaviour.py checks them against the modules that use them."""

ARMS = ("nodp", "sepdp", "transdenoiser",  # training.train_config.ARMS
        "recipe",  # training.methods.recipe.NAME (trains as sepdp)
        "securesgd-prt", "securesgd-sct",  # training.baselines.securesgd.ARMS
        "stobatch")  # training.baselines.stobatch.ARM
OPTIMIZERS = ("sgd", "adam")  # training.train_config.OPTIMIZERS
DENOISERS = ("autoencoder", "tiny", "dncnn")  # training.denoisers.DENOISERS
ACTIVATIONS = ("relu", "tanh", "silu", "softplus")  # the keys of training.denoisers.ACTIVATIONS
OBJECTIVES = ("mse", "stability", "classification", "stability+mse")  # training.objectives.OBJECTIVES
