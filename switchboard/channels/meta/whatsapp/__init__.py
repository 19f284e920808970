"""whatsapp."""
