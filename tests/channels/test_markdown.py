"""The agent's Markdown as Telegram HTML, and splitting that HTML into messages."""

from __future__ import annotations

import random
import re
from html.parser import HTMLParser

import pytest

from switchboard.channels.render.actions import action_markdown
from switchboard.channels.render.telegram import markdown_to_html, render_messages, split_html, visible_text
from switchboard.core.actions import Choice, OfferChoice, SendFile
from tests.fakes.telegram_api import check_html


def utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


class Balance(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.stack: list[str] = []
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack.pop() != tag:
            self.problems.append(tag)


def balanced(markup: str) -> bool:
    checker = Balance()
    checker.feed(markup)
    checker.close()
    return not checker.problems and not checker.stack


# ── rendering ───────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("plain text", "plain text"),
        ("AT&T < 3 > 2", "AT&amp;T &lt; 3 &gt; 2"),
        ("**bold** and __also__", "<b>bold</b> and <b>also</b>"),
        ("*it* and _it_", "<i>it</i> and <i>it</i>"),
        ("~~gone~~", "<s>gone</s>"),
        ("**bold _nested_ more**", "<b>bold <i>nested</i> more</b>"),
        ("***both***", "<i><b>both</b></i>"),
        ("`a <b> & c`", "<code>a &lt;b&gt; &amp; c</code>"),
        ("||spoiler **b**||", "<tg-spoiler>spoiler <b>b</b></tg-spoiler>"),
        ("[site](https://example.com/?q=1&r=2)", '<a href="https://example.com/?q=1&amp;r=2">site</a>'),
        ('[q](https://e.com/"onclick=x)', '<a href="https://e.com/%22onclick=x">q</a>'),
        ("[**bold** link](https://e.com)", '<a href="https://e.com"><b>bold</b> link</a>'),
        ("[`code` link](https://e.com)", '<a href="https://e.com">code link</a>'),
        ("[js](javascript:alert(1))", "[js](javascript:alert(1))"),
        ("[rel](/relative/path)", "rel"),
        ("[ftp](ftp://files.example.com/x)", "ftp"),
        ("<https://auto.example.com>", '<a href="https://auto.example.com">https://auto.example.com</a>'),
        ("![a cat](https://img.example.com/cat.png)", '<a href="https://img.example.com/cat.png">a cat</a>'),
        (
            "![](https://img.example.com/cat.png)",
            '<a href="https://img.example.com/cat.png">https://img.example.com/cat.png</a>',
        ),
        ("# Title with **bold**", "<b>Title with bold</b>"),
        ("line one\nline two", "line one\nline two"),
        ("para one\n\npara two", "para one\n\npara two"),
        ("- a\n- b", "• a\n• b"),
        ("3. three\n4. four", "3. three\n4. four"),
        ("- a\n  - inner\n- b", "• a\n  • inner\n• b"),
        ("> quoted **bold**", "<blockquote>quoted <b>bold</b></blockquote>"),
        ("> outer\n> > inner", "<blockquote>outer\ninner</blockquote>"),
        ("> see [x](https://x.example) and `c`", "<blockquote>see x (https://x.example) and c</blockquote>"),
        ("```\nx < 1\n```", "<pre>x &lt; 1</pre>"),
        (
            "```python\nif a && b:\n    pass\n```",
            '<pre><code class="language-python">if a &amp;&amp; b:\n    pass</code></pre>',
        ),
        ('```py"><script>\nx\n```', "<pre>x</pre>"),
        ("    indented code", "<pre>indented code</pre>"),
        ("| a | b |\n|---|---|\n| 1 | **2** |", "<b>a | b</b>\n1 | <b>2</b>"),
        ("before\n\n---\n\nafter", "before\n\n——————\n\nafter"),
        ("&copy; &amp; &#60;", "© &amp; &lt;"),
        ("", ""),
    ],
)
def test_rendering(markdown: str, expected: str) -> None:
    assert markdown_to_html(markdown) == expected


@pytest.mark.parametrize(
    "hostile",
    [
        "<script>alert(document.cookie)</script>",
        "<b onclick='x'>hi</b>",
        '<a href="javascript:alert(1)">x</a>',
        "<div>\n<img src=x onerror=alert(1)>\n</div>",
        "<!-- comment --> <![CDATA[ x ]]>",
        "</b></i></code></pre>",
        "<tg-spoiler>raw</tg-spoiler> <blockquote>raw</blockquote>",
        "&lt;already escaped&gt; &bogus; & &&",
    ],
)
def test_html_in_model_output_is_escaped_never_passed_through(hostile: str) -> None:
    rendered = markdown_to_html(hostile)
    check_html(rendered)  # Telegram's parser accepts it
    assert re.findall(r"<[^>]*>", rendered) == []  # and no tag survived: everything is text


def test_rendered_output_always_passes_telegrams_parser() -> None:
    rng = random.Random(7)
    pieces = [
        "word", "**b**", "_i_", "~~s~~", "`c<>`", "[l](https://x.y/?a=1&b=2)", "![i](https://x.y/i.png)",
        "<script>", "&", "||sp||", "\n\n", "\n- item ", "\n1. item ", "\n> quote ", "\n# head ",
        "\n```\ncode & <\n```\n",
        "😀", "a_b_c", "*", "**", "[", "]", "(", ")", "\\",
    ]  # fmt: skip
    for _ in range(300):
        markdown = " ".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
        rendered = markdown_to_html(markdown)
        check_html(rendered) if rendered else None
        assert balanced(rendered), markdown


# ── splitting ───────────────────────────────────────────────────────────────────────────────────


def test_short_text_is_one_part() -> None:
    assert render_messages("**hello** world") == ["<b>hello</b> world"]
    assert render_messages("  \n\n ") == []


def test_long_text_is_split_within_the_limit_and_loses_nothing() -> None:
    markdown = "\n\n".join(f"Paragraph {n}: " + "some **bold** and _italic_ words & <escapes> " * 30 for n in range(40))
    parts = render_messages(markdown)
    assert len(parts) > 1
    for part in parts:
        assert utf16(part) <= 4096
        assert balanced(part), part[:100]
        check_html(part)
    whole = visible_text(markdown_to_html(markdown))
    assert re.sub(r"\s+", "", "".join(visible_text(p) for p in parts)) == re.sub(r"\s+", "", whole)
    # cuts fall between paragraphs: every part starts a paragraph
    assert all(visible_text(p).startswith("Paragraph ") for p in parts)


def test_a_cut_inside_formatting_closes_and_reopens_the_tags() -> None:
    markup = '<b>bold <i>both</i> <a href="https://e.com/?a=1&amp;b=2">' + "link " * 40 + "</a></b>"
    parts = split_html(markup, 100)
    assert len(parts) > 2
    for part in parts:
        assert utf16(part) <= 100
        assert balanced(part)
        check_html(part)
    assert all(p.startswith("<b>") and p.endswith("</b>") for p in parts)
    assert all('<a href="https://e.com/?a=1&amp;b=2">' in p for p in parts[1:])


def test_a_long_code_block_keeps_its_language_in_every_part() -> None:
    code = "\n".join(f"value_{n} = {n} < {n + 1} && True" for n in range(600))
    parts = render_messages(f"```python\n{code}\n```")
    assert len(parts) > 1
    for part in parts:
        assert part.startswith('<pre><code class="language-python">') and part.endswith("</code></pre>")
        assert utf16(part) <= 4096
        check_html(part)
    texts = [visible_text(p) for p in parts]
    assert "".join(texts) == code
    assert all(t.endswith("\n") for t in texts[:-1])  # cuts fell on line ends: no line was broken


def test_entities_are_never_cut() -> None:
    markup = "&amp;&lt;&gt;" * 500
    parts = split_html(markup, 50)
    for part in parts:
        assert utf16(part) <= 50
        assert re.fullmatch(r"(&amp;|&lt;|&gt;)+", part), part
    assert "".join(parts) == markup


def test_a_word_longer_than_the_limit_is_cut_hard() -> None:
    parts = split_html("x" * 250, 100)
    assert len(parts) == 3 and all(90 <= len(p) <= 100 for p in parts[:2])
    assert "".join(parts) == "x" * 250


def test_astral_characters_count_twice_and_are_never_halved() -> None:
    parts = split_html("😀" * 100, 51)
    assert all(utf16(p) <= 51 for p in parts)
    assert "".join(parts) == "😀" * 100
    assert all(20 <= len(p) <= 25 for p in parts[:-1])  # 25 emoji are 50 UTF-16 units


def test_parts_that_would_hold_only_whitespace_are_dropped() -> None:
    parts = split_html("<b>" + "a " * 30 + "</b>" + "\n" * 50 + "tail", 40)
    assert all(visible_text(p).strip() for p in parts)
    assert parts[-1].endswith("tail")


@pytest.mark.parametrize("limit", [60, 200, 4096])
def test_random_documents_split_cleanly(limit: int) -> None:
    rng = random.Random(limit)
    words = ["alpha", "**bold words**", "_it_", "`c & d`", "<x>", "😀", "[l](https://e.com/p?q=1)", "||s||"]
    for _ in range(20):
        paragraphs = [
            " ".join(rng.choice(words) for _ in range(rng.randint(1, 120))) for _ in range(rng.randint(1, 12))
        ]
        markdown = "\n\n".join(paragraphs)
        html = markdown_to_html(markdown)
        parts = split_html(html, limit)
        for part in parts:
            assert utf16(part) <= limit
            assert balanced(part)
            check_html(part)
        assert re.sub(r"\s+", "", "".join(visible_text(p) for p in parts)) == re.sub(r"\s+", "", visible_text(html))


def test_actions_without_a_native_form_become_markdown() -> None:
    report = SendFile(path="out/report.pdf", caption="Your **report**")
    assert action_markdown(report) == "Your **report**\n\n📎 report.pdf"
    assert action_markdown(SendFile(path="chart.png")) == "📎 chart.png"
    options = [Choice(id="now", label="Now"), Choice(id="later", label="Later")]
    assert action_markdown(OfferChoice(question="When?", options=options)) == "When?\n\n1. Now\n2. Later"


def test_plain_replies_skip_the_parser_and_match_what_it_renders() -> None:
    from switchboard.channels.render.telegram import _PLAIN

    rng = random.Random(7)
    allowed = "aZq09 ,.;:?!'\"()/%$-"
    fast = 0
    for _ in range(3000):
        text = rng.choice("aZ") + "".join(rng.choice(allowed) for _ in range(rng.randint(0, 24)))
        if _PLAIN.fullmatch(text):
            fast += 1
            assert render_messages(text) == split_html(markdown_to_html(text), 4096) == [text]
    assert fast > 2000
    for text in ("ask @alice", "1. item", "a\nb", "a *b*", "a & b", "a_b_", "    code", "#1 < 2", "a  ", "a [b](c)"):
        assert not _PLAIN.fullmatch(text), text
    assert render_messages("x" * 5000) == split_html("x" * 5000, 4096)


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("ask @alice", "ask @\u2060alice"),
        ("**@bob** and _@carol_", "<b>@\u2060bob</b> and <i>@\u2060carol</i>"),
        ("> cc @dave", "<blockquote>cc @\u2060dave</blockquote>"),
        ("[@erin](https://example.com)", '<a href="https://example.com">@\u2060erin</a>'),
        ("mail bob@example.com", "mail bob@example.com"),
        ("`@frank` stays code", "<code>@frank</code> stays code"),
        ("```\n@grace\n```", "<pre>@grace</pre>"),
    ],
)
def test_usernames_in_model_output_are_defused_so_no_group_member_is_notified(markdown: str, expected: str) -> None:
    # Telegram's clients turn "@username" into a mention that notifies that member; a word joiner after the "@"
    # reads the same and is no mention. Code keeps its text byte for byte (Telegram finds no mentions there).
    assert render_messages(markdown) == [expected]
    assert "@alice" not in visible_text(render_messages("ask @alice")[0])
