"""Web search and image generation as native tools, each behind a pluggable provider.

``web_search`` uses the model provider's hosted search where it has one (OpenAI's Responses API) and a configured
search API otherwise (:mod:`~switchboard.core.tools.web.search`, called through egress); ``generate_image`` asks an
image provider (:mod:`~switchboard.core.tools.web.images`) and sends the picture through the channel's file send.
"""
