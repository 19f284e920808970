"""Knowledge: files and URLs indexed for an agent, read-only, searched and read by id at run time.

Stages, one module each: ``config`` (the agent's ``knowledge:`` block), ``extraction`` (sources to text), ``keywords``
(TF-IDF), ``summaries`` (the agent's model), ``index`` (documents in the memory store, re-indexed on change) and
``tools`` (``search_knowledge`` and ``read_source``).
"""
