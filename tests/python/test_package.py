"""The package's public surface: __init__ re-exports every module's
__all__, and the package's __all__ is exactly that."""

import types

import trainwatch
from trainwatch import _convert, _fields, client, control, restart


def test_all_is_every_public_name_and_each_exists():
    public = {n for n, v in vars(trainwatch).items()
              if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert public == set(trainwatch.__all__)
    assert len(trainwatch.__all__) == len(set(trainwatch.__all__))
    for name in trainwatch.__all__:
        assert getattr(trainwatch, name) is not None


def test_each_module_names_what_it_defines_for_users():
    for module in (client, _fields, control, restart):
        assert set(module.__all__) <= set(trainwatch.__all__), module.__name__
        for name in module.__all__:
            assert getattr(trainwatch, name) is getattr(module, name), name
        # A class or function defined in the module and not private is in
        # its __all__, or is a helper the package's other modules share.
        for name, value in vars(module).items():
            if name.startswith("_") or not isinstance(value, (type, types.FunctionType)):
                continue
            if value.__module__ != module.__name__:
                continue
            assert name in module.__all__ or name in SHARED_HELPERS, f"{module.__name__}.{name}"
    # The converters are the client's slow path: nothing of theirs is public.
    assert not [n for n, v in vars(_convert).items()
                if not n.startswith("_") and isinstance(v, types.FunctionType)
                and v.__module__ == _convert.__name__]


# restart.item_ids: the batch ids of an item, for SkipBatches and Control.
SHARED_HELPERS = {"item_ids"}


def test_the_enums_are_the_protos():
    # Built from the binding's descriptors: each name is a proto value's
    # (less its enum's UNSPECIFIED, kept only for the balancing), at its number.
    from trainwatch import _trainwatch
    protos = _trainwatch.ENUMS
    assert trainwatch.LAYER_KINDS == {k: v for k, v in protos["LayerKind"].items() if v}
    assert trainwatch.FP8_FORMATS == {k: v for k, v in protos["Fp8Format"].items() if v}
    assert trainwatch.EVENT_KINDS == {k.lower(): v for k, v in protos["EventKind"].items() if v}
    assert trainwatch.DIRECTIVE_STATES["applied"] == protos["DirectiveState"]["APPLIED"]
    assert trainwatch.MOE_BALANCING["UNSPECIFIED"] == 0
    assert trainwatch.MOE_BALANCING["AUX_FREE_BIAS"] == protos["MoeBalancing"]["AUX_FREE_BIAS"]
    # What users pass did not change: the names they wrote before.
    assert set(trainwatch.EVENT_KINDS) == {"checkpoint_saved", "run_finished", "run_failed"}
    assert set(trainwatch.LAYER_KINDS) == {"DENSE", "EMBEDDING", "OUTPUT", "NORM", "ROUTER"}
