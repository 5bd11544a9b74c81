"""The reads of entries (ListEntries, and LoadView: window, summary buffer, backlog, tool
groups kept whole), run against every TranscriptStore: test_views_domain.py on the
in-memory store, test_views_store.py on PostgreSQL.
"""

from __future__ import annotations

import pytest

from services.common.domain import Usage
from services.common.errors import DomainError
from services.transcript.service import TranscriptService
from tests.transcript.support import (
    ServiceCases,
    assistant,
    new_conversation,
    reason_of,
    tool,
    user,
)


class ViewCases(ServiceCases):
    """Subclasses provide a `store` fixture."""

    async def test_list_entries_pages_with_tokens_bound_to_the_request(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.append(namespace, cid, 0, [user(str(i)) for i in range(25)], "")
        seen, token = [], ""
        while True:
            page = await service.list_entries(namespace, cid, 3, 0, 10, token)
            seen += [e.sequence for e in page.entries]
            token = page.next_page_token
            if not token:
                break
        assert seen == list(range(4, 26))
        first = await service.list_entries(namespace, cid, 0, 0, 5, "")
        for args in [
            (namespace + "x", cid, 0, 0, 5),
            (namespace, cid, 1, 0, 5),
            (namespace, cid, 0, 7, 5),
        ]:
            with pytest.raises(DomainError) as caught:
                await service.list_entries(*args, first.next_page_token)
            assert reason_of(caught) in {"INVALID_PAGE_TOKEN", "CONVERSATION_NOT_FOUND"}
        tampered = (
            first.next_page_token[:-2]
            + ("A" if first.next_page_token[-2] != "A" else "B")
            + first.next_page_token[-1]
        )
        with pytest.raises(DomainError) as caught:
            await service.list_entries(namespace, cid, 0, 0, 5, tampered)
        assert reason_of(caught) == "INVALID_PAGE_TOKEN"
        bounded = await service.list_entries(namespace, cid, 0, 7, 0, "")
        assert [e.sequence for e in bounded.entries] == list(range(1, 8))

    async def test_view_splits_window_buffer_and_backlog(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.append(namespace, cid, 0, [user(str(i)) for i in range(1, 101)], "")
        view = await service.load_view(namespace, cid, 16, 30, 10)
        assert view.version == 1 and view.last_sequence == 100
        assert [e.sequence for e in view.window] == list(range(85, 101))
        assert [e.sequence for e in view.summary_buffer] == list(range(11, 41))
        assert view.summary_backlog == 84 - 40
        caught_up = await service.load_view(namespace, cid, 16, 100, 84)
        assert caught_up.summary_buffer == [] and caught_up.summary_backlog == 0
        short = await service.load_view(namespace, cid, 200, 10, 0)
        assert len(short.window) == 100 and short.summary_buffer == []

    async def test_empty_conversation_view(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        view = await service.load_view(namespace, cid, 16, 16, 0)
        assert (
            view.version,
            view.last_sequence,
            list(view.window),
            list(view.summary_buffer),
            view.summary_backlog,
        ) == (0, 0, [], [], 0)

    async def test_window_never_starts_with_an_orphaned_tool_result(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.append(
            namespace,
            cid,
            0,
            [
                user("q"),
                assistant("", "a", "b"),
                tool("a"),
                tool("b"),
                assistant("answer"),
            ],
            "",
        )
        # Window 3 would start at the first result (3): it starts after the results.
        view = await service.load_view(namespace, cid, 3, 10, 0)
        assert [e.sequence for e in view.window] == [5]
        assert [e.sequence for e in view.summary_buffer] == [1, 2, 3, 4]
        # Window 2 would start at a result with nothing after the group but the answer.
        view = await service.load_view(namespace, cid, 2, 10, 0)
        assert [e.sequence for e in view.window] == [5]
        await service.append(namespace, cid, 1, [user("q2"), assistant("", "c")], "")
        await service.append(namespace, cid, 2, [tool("c")], "")
        # The transcript ends inside a group: shrinking would empty the window,
        # so it starts at the call instead.
        view = await service.load_view(namespace, cid, 1, 10, 0)
        assert [e.sequence for e in view.window] == [7, 8]
        assert view.window[0].message.tool_calls

    async def test_buffer_never_separates_a_tool_call_from_its_results(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.append(
            namespace,
            cid,
            0,
            [
                user("1"),
                user("2"),
                assistant("", "a", "b"),
                tool("a"),
                tool("b"),
                user("6"),
                user("7"),
                user("8"),
            ],
            "",
        )
        # A batch of 4 would end after result "a": it ends before the call.
        view = await service.load_view(namespace, cid, 1, 4, 0)
        assert [e.sequence for e in view.summary_buffer] == [1, 2]
        assert view.summary_backlog == 7 - 2
        # From the call on, a batch of 1 cannot shrink: it takes the whole group.
        view = await service.load_view(namespace, cid, 1, 1, 2)
        assert [e.sequence for e in view.summary_buffer] == [3, 4, 5]
        assert view.summary_backlog == 2

    async def test_view_reports_a_committed_request(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.append(namespace, cid, 0, [user(), assistant()], "turn-1", Usage(3, 4, 1))
        view = await service.load_view(namespace, cid, 4, 4, 0, "turn-1")
        assert view.prior_append is not None
        assert (
            view.prior_append.first_sequence,
            view.prior_append.last_sequence,
            view.prior_append.usage,
        ) == (1, 2, Usage(3, 4, 1))
        assert (await service.load_view(namespace, cid, 4, 4, 0, "turn-2")).prior_append is None

    @pytest.mark.parametrize(
        ("window", "batch", "through", "reason"),
        [
            (0, 1, 0, "INVALID_WINDOW"),
            (4097, 1, 0, "INVALID_WINDOW"),
            (1, 0, 0, "INVALID_SUMMARY_BATCH"),
            (1, 4097, 0, "INVALID_SUMMARY_BATCH"),
            (1, 1, -1, "INVALID_SEQUENCE"),
            (1, 1, 99, "SEQUENCE_OUT_OF_RANGE"),
        ],
    )
    async def test_view_bounds(
        self,
        service: TranscriptService,
        namespace: str,
        window: int,
        batch: int,
        through: int,
        reason: str,
    ) -> None:
        cid = await new_conversation(service, namespace)
        with pytest.raises(DomainError) as caught:
            await service.load_view(namespace, cid, window, batch, through)
        assert reason_of(caught) == reason
