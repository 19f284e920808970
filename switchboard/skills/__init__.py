"""Skills: folders with a ``SKILL.md`` (the agentskills.io format) that agents load on demand.

- :mod:`~switchboard.skills.package`: the format and its validation, content hashes, :class:`SkillRef`;
- :mod:`~switchboard.skills.sources`: reading a folder or a zip safely (links, traversal and zip bombs refused);
- :mod:`~switchboard.skills.store`: versioned packages under the data directory, built-ins and templates;
- :mod:`~switchboard.skills.loading`: the agent's skill catalogue and the ``use_skill`` tool;
- :mod:`~switchboard.skills.command`: ``switchboard skills add|list|show|remove``.

This module imports none of them, so that :mod:`switchboard.core.tools.definition` may name :class:`SkillRef` without a
cycle.
"""
