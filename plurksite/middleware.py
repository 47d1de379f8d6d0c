"""The site's own middleware."""


def head_without_body(get_response):
    """A HEAD answer carries no content (RFC 9110, 9.3.2), but gunicorn sends whatever the view
    returned, and on a kept-alive connection those bytes would be read as the next answer.  Listed
    first, so that it runs last: the Content-Length the inner middleware counted (the GET's) stays."""
    def middleware(request):
        response = get_response(request)
        if request.method == "HEAD":
            if response.streaming:
                response.streaming_content = ()
            else:
                response.content = b""
        return response

    return middleware
