"""docs/integrate.md section 5: a page's script is a static file (a Content-Security-Policy that
allows the edge blocks inline scripts), and the template gives it PATH_PREFIX by the context
processor ``fastpoll.context_processors.fastpoll``."""
import pathlib
import re

from django.template import engines
from django.test import RequestFactory, override_settings

import fastpoll

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "integrate.md"
PAGE = '<body data-edge-url="{{ edge_url }}" data-poll-prefix="{{ fastpoll_prefix }}">'


def _render(settings, path_prefix):
    settings.FASTPOLL = dict(settings.FASTPOLL, PATH_PREFIX=path_prefix)
    with override_settings(TEMPLATES=[{
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "OPTIONS": {"context_processors": ["fastpoll.context_processors.fastpoll"]}}]):
        template = engines["django"].from_string(PAGE)
        return template.render({"edge_url": "https://poll.example.com"}, RequestFactory().get("/"))


def test_the_context_processor_gives_the_page_path_prefix(settings):
    assert _render(settings, "/Poll/") == '<body data-edge-url="https://poll.example.com" data-poll-prefix="/Poll/">'
    assert 'data-poll-prefix="/api/poll/"' in _render(settings, "/api/poll/")


def test_the_docs_put_no_inline_script_on_a_page():
    """Every <script> of the docs' page snippets loads a file: an inline one dies under the CSP
    that "The edge" prescribes (default-src 'self')."""
    text = DOCS.read_text()
    pages = "".join(re.findall(r"```html\n(.*?)```", text, re.S))
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", pages, re.S)
    assert scripts
    for attributes, body in scripts:
        assert "src=" in attributes and not body.strip(), (attributes, body)
    assert "fastpoll.context_processors.fastpoll" in text and "collectstatic" in text


def test_the_context_processor_is_no_public_api_name():
    assert "context_processors" not in fastpoll.__all__
