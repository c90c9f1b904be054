"""What the framework adapters (touchstone.hf, touchstone.torchtitan) share about a torch module: the
check that an argument is one, and its gradients by parameter name. Needs no torch import: a module is
recognised by its `named_parameters`, so the package imports without torch."""

from typing import Any, Iterator, Tuple


def check_module(model: Any, argument: str) -> None:
    """ValueError naming `argument` unless `model` is a torch module (has named_parameters)."""
    if not callable(getattr(model, "named_parameters", None)):
        raise ValueError(f"{argument} is of type {type(model).__name__}, not a torch module")


def named_gradients(model: Any, argument: str) -> Iterator[Tuple[str, Any]]:
    """(name, gradient) of every parameter of `model` (after backward; a tied weight once); ValueError
    naming a parameter without one."""
    check_module(model, argument)
    for name, parameter in model.named_parameters():
        if parameter.grad is None:
            raise ValueError(f"{name}: has no gradient (was backward run?)")
        yield name, parameter.grad
