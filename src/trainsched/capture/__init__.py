"""torch -> Graph. The only package besides ``runtime`` that imports torch.

``capture(model, example_inputs, ...)`` traces a model and costs every op; ``zoo`` builds named
models with random weights.
"""

from trainsched.capture.capture import GRANULARITIES, TIERS, capture, measure_device
from trainsched.capture.zoo import ZooModel, build, models_taking, names, size_options

__all__ = ["GRANULARITIES", "TIERS", "ZooModel", "build", "capture", "measure_device",
           "models_taking", "names", "size_options"]
