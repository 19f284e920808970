"""``conforms``: isinstance against runtime-checkable protocols, remembered per class only when the class has it all."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from switchboard.core.protocols import conforms


@runtime_checkable
class Named(Protocol):
    name: str

    def greet(self) -> str: ...


class Full:
    name = "full"

    def greet(self) -> str:
        return self.name


class PerInstance:
    """Has ``greet`` on the class, and ``name`` only on the instances that were given one."""

    def __init__(self, name: str | None) -> None:
        if name is not None:
            self.name = name

    def greet(self) -> str:
        return "hi"


def test_a_class_with_every_member_conforms_every_time() -> None:
    assert conforms(Full(), Named) and conforms(Full(), Named)
    assert not conforms(object(), Named)


def test_an_instance_attribute_member_is_asked_per_instance() -> None:
    assert conforms(PerInstance("a"), Named)
    assert not conforms(PerInstance(None), Named)  # the first answer was not taken for the whole class
    assert conforms(PerInstance("b"), Named)
