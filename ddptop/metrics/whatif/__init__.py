"""Provides the what-if model (issue 23): fitted from one segment's sampled steps, it predicts step time, exposed
communication and overlap for every strategy, DDP bucket size, async_op, world size and link rate.

Entry points: `fit(segment_data) -> Model`, `predict(model, config) -> Prediction`,
`predict_table(segment_data) -> [Prediction]`; ddptop.record.whatif.segment_data reads a recording's segment.
Pure Python: no torch, no textual.
"""

from ddptop.metrics.whatif.data import CommSample, LayerTime, SegmentData
from ddptop.metrics.whatif.model import Config, Model, Prediction, fit, grid, predict, predict_table

__all__ = ["CommSample", "Config", "LayerTime", "Model", "Prediction", "SegmentData", "fit", "grid", "predict",
           "predict_table"]
