"""The agent's Markdown in each channel's dialect, and split into messages within each channel's limit.

``markdown`` reads Markdown (one syntax-tree walker, code fences line by line); one module per dialect
(``telegram``, ``slack``, ``discord``, ``teams``, ``whatsapp``, ``plain`` for Messenger and Instagram); ``split``
cuts a reply into parts; ``actions`` writes the Markdown that stands in for actions a channel shows as text.
"""
