"""Skills: folders with a ``SKILL.md`` (the agentskills.io format) that agents load on demand.

- :mod:`~switchboard.skills.package`: the format and its validation, content hashes, :class:`SkillRef`;
- :mod:`~switchboard.skills.sources`: reading a folder or a zip safely (links, traversal and zip bombs refused);
- :mod:`~switchboard.skills.store`: versioned packages under the data directory, built-ins and templates.

The agent's skill catalogue and the ``use_skill`` tool are core's (:mod:`switchboard.core.tools.builtin.skills`),
``switchboard skills add|list|show|remove`` the CLI's (:mod:`switchboard.cli.skills`): this package sits below
core and imports none of it.
"""
