"""Workflows: a YAML definition compiled into a checked, canonical, digest-pinned plan.

Modules, in pipeline order: :mod:`.dsl` (positioned source and typed definition),
:mod:`.check_schema`, :mod:`.check_graph`, :mod:`.check_types`, :mod:`.check_budget` and
:mod:`.admission` (the five check layers), :mod:`.compiler` (``compile_workflow``),
:mod:`.plan` (the artefact the engine runs). Each stage kind (task, decision, fork, join) is one
module of :mod:`.kinds` owning its DSL shape, checks, plan form and drawing, registered in one
table; :mod:`.values` holds what plan stages are made of. At run time the engine uses
:mod:`.bindings` (``resolve_inputs``) and :mod:`.expressions` (``evaluate``); :mod:`.activation`
keeps immutable versions in a store and :mod:`.render` draws plans. Everything here is pure: no
files, clocks or network.
"""
