"""Skills: folders with a ``SKILL.md`` (the agentskills.io format) that agents load on demand.

The format is :mod:`~switchboard.skills.package`, safe reading :mod:`~switchboard.skills.sources`, the versioned store
:mod:`~switchboard.skills.store`. The agent's skill catalogue and ``use_skill`` are core's
(:mod:`switchboard.core.tools.builtin.skills`); this package sits below core and imports none of it.
"""
