"""Hostile values in shared places (a platform, or whoever holds its webhook secret, sending what no app would).

Whatever the gateway accepts is queued as JSON and read back by the worker: a value that does not survive that round
trip would leave a message no worker can read. A webhook either refuses such a body (400) or queues a message that
reads back as it was accepted.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.core.messages import InboundMessage, Location
from switchboard.errors import MalformedBodyError
from tests.channels.test_telegram import SECRET, SECRET_HEADER, request, settings

_UPDATE = (
    b'{"update_id": 7, "message": {"message_id": 1, "date": 1, "chat": {"id": 5, "type": "private"}, '
    b'"from": {"id": 5, "is_bot": false, "first_name": "M"}, "%s": %s}}'
)
PLACES = {
    "nan latitude": (b"location", b'{"latitude": NaN, "longitude": 1}'),
    "infinite longitude": (b"location", b'{"latitude": 1, "longitude": Infinity}'),
    "negative infinity": (b"location", b'{"latitude": -Infinity, "longitude": 1}'),
    "latitude past the pole": (b"location", b'{"latitude": 1e308, "longitude": 1}'),
    "venue at nan": (b"venue", b'{"location": {"latitude": NaN, "longitude": NaN}, "title": "t", "address": "a"}'),
}


@pytest.mark.parametrize("case", list(PLACES))
async def test_a_place_no_map_has_is_refused_or_reads_back_as_accepted(case: str) -> None:
    field, value = PLACES[case]
    adapter = TelegramChannel(settings())
    try:
        inbound = await adapter.receive(request(_UPDATE % (field, value), {SECRET_HEADER: SECRET}))
    except MalformedBodyError as err:
        assert err.status == 400
        return
    for message in inbound.messages:  # what the queue stores, then what the worker reads
        assert InboundMessage.model_validate_json(message.model_dump_json()) == message
    for message in inbound.messages:
        for part in getattr(message.event, "shared", ()):
            assert -90 <= part.latitude <= 90 and -180 <= part.longitude <= 180, part


@pytest.mark.parametrize("latitude", [float("nan"), float("inf"), -90.5, 1e308])
def test_no_channel_can_build_a_place_the_queue_cannot_read_back(latitude: float) -> None:
    with pytest.raises(ValidationError):
        Location(latitude=latitude, longitude=0)
