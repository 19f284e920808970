"""Skills: folders with a ``SKILL.md`` (the agentskills.io format) that agents load on demand.

The format is :mod:`~switchboard.skills.package`, safe reading :mod:`~switchboard.skills.sources`, the versioned store
:mod:`~switchboard.skills.store`, loading into a turn :mod:`~switchboard.skills.loading`. This module imports none of
them, so that :mod:`switchboard.core.tools.definition` may name :class:`SkillRef` without a cycle.
"""
