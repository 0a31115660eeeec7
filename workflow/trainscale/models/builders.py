"""The table of a framework's model builders, by catalog model name.

`torch_models.py` (PyTorch) and `keras_models.py` (Keras) each build every model of the catalog.
Each decorates its builder of a model with `@BUILDERS.builds(name)` instead of listing the
names again, and `check_complete` fails at import when a catalog model has no builder, so a
model added to the catalog cannot be forgotten in one framework. The architecture facts both
frameworks build from are held here once.
"""

from __future__ import annotations

from collections.abc import Callable

from trainscale.plan import catalog

#: VGG-19 (torchvision config E): the conv widths of each of its five stages, each stage
#: closed by a 2x2 max pool.
VGG19_STAGES: tuple[tuple[int, ...], ...] = (
    (64, 64),
    (128, 128),
    (256, 256, 256, 256),
    (512, 512, 512, 512),
    (512, 512, 512, 512),
)


class Builders(dict[str, Callable]):
    """name -> the function that builds catalog model `name` in one framework."""

    def __init__(self, framework: str) -> None:
        super().__init__()
        self.framework = framework

    def builds(self, name: str) -> Callable[[Callable], Callable]:
        """Register the decorated function as the builder of catalog model `name`."""
        if name not in catalog.MODELS:
            raise KeyError(
                f"{name!r} is not a model of trainscale.plan.catalog.MODELS: add its row"
            )

        def register(builder: Callable) -> Callable:
            self[name] = builder
            return builder

        return register

    def checked(self, name: str, in_shape: tuple[int, ...], num_classes: int) -> tuple[int, ...]:
        """`in_shape` as ints, after checking the arguments of a `build`: a model this table
        builds, a positive (C, H, W) for an image model or (context,) for a token model, and
        at least one class (the vocabulary of a token model); else ValueError naming the
        argument."""
        if name not in self:
            raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(catalog.MODELS)}")
        tokens = catalog.MODELS[name].input == "tokens"
        want = "(context,)" if tokens else "(C, H, W)"
        if len(in_shape) != (1 if tokens else 3) or any(int(d) < 1 for d in in_shape):
            raise ValueError(f"in_shape must be {want} with positive sizes, got {in_shape!r}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        return tuple(int(d) for d in in_shape)

    def check_complete(self) -> None:
        """Raise ImportError naming the catalog models this framework has no builder of."""
        missing = [m for m in catalog.MODELS if m not in self]
        if missing:
            raise ImportError(f"no {self.framework} builder of the catalog models {missing}")
