"""A `Cell`: one matrix combination and the settings it runs under, as every constraint of the
catalog looks at it (trainscale.plan.catalog re-exports it). Imports no framework."""

from __future__ import annotations

from dataclasses import dataclass

from trainscale.plan.catalog.models import MODELS, Model


@dataclass(frozen=True)
class Cell:
    """What a constraint looks at: one matrix combination and the settings it runs under."""

    strategy: str
    model: str
    dataset: str
    workers: int
    nodes: int
    batch_size: int
    batch_mode: str
    precision: str
    accelerator: str  # "cpu" or "cuda"
    microbatches: int = 1
    schedule: str = "gpipe"
    input_side: int = 0  # smallest side of the data set's images
    data_input: str = "image"  # what the data set holds: "image" or "tokens" (Model.input)
    user_data: bool = False  # the user's image files (`datasets:`), decoded while training
    resized: bool = False  # a built-in data set trained at another `image_size`
    own: Model | None = None  # the row of a user's own model (config `models:`)
    tp: int = 1  # tensor-parallel degree (matrix tp)
    seq_len: int = 0  # tokens per window (0: images)
    classes: int = 0  # the data set's classes; its vocabulary for token data
    #: the GPUs a node gives the run's ranks where the planner knows them (a study run on this
    #: machine); None where each worker is given one (a cluster profile's request)
    gpus_per_node: int | None = None

    @property
    def row(self) -> Model:
        """The model's catalog row: a built-in's, or the user's model's from its pre-flight."""
        return self.own if self.own is not None else MODELS[self.model]

    @property
    def world(self) -> int:
        return self.workers * self.nodes
