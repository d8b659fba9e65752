"""verl's ``create_colocated_worker_raw_cls``: the fused worker class itself, to subclass.

verl users write methods that drive several roles in one process on a subclass of the
fused class (``self.critic.sub(self.actor.add(x))``); hf-controller's
:func:`~hf_controller.create_colocated_worker_cls_fused` wraps that class with its init
arguments, and this hands out the class.
"""

from __future__ import annotations

from hf_controller.colocation import create_colocated_worker_cls_fused
from hf_controller.worker_class import ClassWithInitArgs


def create_colocated_worker_raw_cls(class_dict: dict[str, ClassWithInitArgs]) -> type:
    """The fused worker class of the roles in ``class_dict``: it constructs every role,
    reaches each as ``self.<role>``, and gives the roles ``fused_workers`` (verl's
    ``fused_worker_dict``). Subclass it, decorate with ``@ray.remote`` if you like, and
    put it in a group; ``group.fuse(class_dict.keys())`` then gives ``group.<role>``."""
    return create_colocated_worker_cls_fused(class_dict).cls
