"""Subscriptions: the images of every publisher on a channel and stream, polled together."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import DriverError
from ..files.doorbell import Doorbell
from ..logbuffer import BlockHandler, FragmentHandler
from .errors import renewed
from .image import Image

ImageHandler = Callable[[Image], object]
"""Callback for an image that became available or unavailable (runs on the client's thread)."""


class Subscription:
    """Polls its images fairly (round robin start) and learns of new and departed images from the
    client thread; the image list is replaced, never mutated, so ``poll`` needs no lock."""

    def __init__(
        self,
        *,
        channel: str,
        stream_id: int,
        registration_id: int,
        on_available_image: ImageHandler | None,
        on_unavailable_image: ImageHandler | None,
        on_close: Callable[[Subscription], None],
        doorbell: Callable[[], Doorbell] | None = None,
    ) -> None:
        self.channel = channel
        self.stream_id = stream_id
        self.registration_id = registration_id
        self.on_available_image = on_available_image
        self.on_unavailable_image = on_unavailable_image
        self._on_close = on_close
        self._doorbell = doorbell
        self._images: tuple[Image, ...] = ()
        self._round_robin = 0
        self._closed = False
        self.driver_error: DriverError | None = None
        """Why the media driver was lost, once it was; the subscription is then closed."""

    def poll(self, handler: FragmentHandler, fragment_limit: int = 10) -> int:
        """Deliver up to ``fragment_limit`` fragments across images; returns how many were delivered.

        Once the media driver is lost, the subscription is closed (``is_closed``, ``driver_error``) and
        ``poll`` raises ``DriverLostError``: a polling loop cannot mistake a dead driver for silence."""
        images = self._images
        count = len(images)
        if count == 1:
            return images[0].poll(handler, fragment_limit)
        if count == 0:
            if self.driver_error is not None:
                raise renewed(self.driver_error)
            return 0
        start = self._round_robin = (self._round_robin + 1) % count
        fragments = 0
        for i in range(count):
            fragments += images[(start + i) % count].poll(handler, fragment_limit - fragments)
            if fragments >= fragment_limit:
                break
        return fragments

    def block_poll(self, handler: BlockHandler, block_length_limit: int = 1 << 20) -> int:
        """Hand each image's run of whole frames to ``handler(block, session_id, term_id)``, one call per
        block (see ``Image.block_poll``); returns the bytes consumed across images, at most about
        ``block_length_limit`` (a first frame longer than what is left is still taken whole)."""
        images = self._images
        count = len(images)
        if count == 1:
            return images[0].block_poll(handler, block_length_limit)
        if count == 0:
            return 0
        start = self._round_robin = (self._round_robin + 1) % count
        consumed = 0
        for i in range(count):
            if consumed >= block_length_limit:
                break
            consumed += images[(start + i) % count].block_poll(handler, block_length_limit - consumed)
        return consumed

    @property
    def images(self) -> tuple[Image, ...]:
        """The images attached now (a snapshot: the tuple is replaced, never changed)."""
        return self._images

    @property
    def doorbell(self) -> Doorbell | None:
        """The doorbell of the context that made this subscription (made on first use), on which an
        asyncio reader parks; None for a subscription made without a context, or once closed."""
        if self._doorbell is None or self._closed:
            return None
        try:
            return self._doorbell()
        except RuntimeError:  # the context closed
            return None

    @property
    def image_count(self) -> int:
        """How many images are attached now."""
        return len(self._images)

    @property
    def is_connected(self) -> bool:
        """True while at least one publisher's image is attached."""
        return bool(self._images)

    @property
    def is_closed(self) -> bool:
        """True once closed by ``close`` or by the loss of the media driver."""
        return self._closed

    def image_by_session_id(self, session_id: int) -> Image | None:
        """The attached image of publisher session ``session_id``, or None."""
        for image in self._images:
            if image.session_id == session_id:
                return image
        return None

    def _add_image(self, image: Image) -> None:
        self._images = (*self._images, image)
        if self.on_available_image is not None:
            self.on_available_image(image)

    def _remove_image(self, correlation_id: int) -> Image | None:
        for image in self._images:
            if image.correlation_id == correlation_id:
                self._images = tuple(i for i in self._images if i is not image)
                image._release()
                if self.on_unavailable_image is not None:
                    self.on_unavailable_image(image)
                return image
        return None

    def _lose(self, error: DriverError) -> None:
        """The driver is gone: close every image and the subscription, and remember why."""
        self.driver_error = error
        self._closed = True
        self._release_all()

    def _release_all(self) -> None:
        images, self._images = self._images, ()
        for image in images:
            image._release()

    def close(self) -> None:
        """Stop receiving: the driver forgets this subscription and its images close."""
        if self._closed:
            return
        self._closed = True
        self._on_close(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Subscription(channel={self.channel!r}, stream_id={self.stream_id}, images={len(self._images)}, "
            f"closed={self._closed})"
        )
