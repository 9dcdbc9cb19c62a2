"""The sweep's URL stand-ins, answered inside a run: Python imports this folder's sitecustomize at startup.

NBDDP_SWEEP_URLS (set by the sweep, tools/standin_urls.py) maps each URL a notebook names that has a stand-in to
`[local file, content type]`. A request for exactly such a URL is answered from the file by the clients notebooks
fetch with: urllib (`urlopen`, `urlretrieve`, IPython's `Audio(url)`), requests, httpx (Transformers 5's
`load_image`) and datasets (`data_files` URLs, which it refuses to fetch in offline mode: a stand-in is a local
file, so datasets gets its path). Every other URL goes the client's usual way, so it fails as it would without the
hook. Each client is patched when it is first imported, so a run that never imports one pays nothing for it.
"""
import email
import importlib.abc
import json
import os
import sys

STANDINS = {url: tuple(entry) for url, entry in json.loads(os.environ.get("NBDDP_SWEEP_URLS") or "{}").items()}


def _headers(url: str) -> dict:
    path, content_type = STANDINS[url]
    return {"Content-Type": content_type, "Content-Length": str(os.path.getsize(path))}


def _patch_urllib(request) -> None:
    import urllib.response

    for handler, method in ((request.HTTPHandler, "http_open"), (getattr(request, "HTTPSHandler", None), "https_open")):
        if handler is None:  # Python without ssl
            continue
        opens = getattr(handler, method)

        def open_standin(self, req, opens=opens):
            if req.full_url not in STANDINS:
                return opens(self, req)
            headers = email.message_from_string("".join(f"{k}: {v}\n" for k, v in _headers(req.full_url).items()))
            response = urllib.response.addinfourl(open(STANDINS[req.full_url][0], "rb"), headers, req.full_url, 200)
            response.msg = "OK"  # the reason, as do_open sets it: urllib's HTTPErrorProcessor reads it
            return response

        setattr(handler, method, open_standin)


def _patch_requests(adapters) -> None:
    send = adapters.HTTPAdapter.send

    def send_standin(self, request, *args, **kwargs):
        if request.url not in STANDINS:
            return send(self, request, *args, **kwargs)
        import urllib3

        raw = urllib3.HTTPResponse(body=open(STANDINS[request.url][0], "rb"), headers=_headers(request.url),
                                   status=200, reason="OK", preload_content=False, decode_content=False)
        return self.build_response(request, raw)

    adapters.HTTPAdapter.send = send_standin


def _patch_httpx(httpx) -> None:
    handle = httpx.HTTPTransport.handle_request

    def handle_standin(self, request):
        url = str(request.url)
        if url not in STANDINS:
            return handle(self, request)
        with open(STANDINS[url][0], "rb") as file:
            return httpx.Response(200, headers=_headers(url), content=file.read(), request=request)

    httpx.HTTPTransport.handle_request = handle_standin


def _patch_datasets(file_utils) -> None:
    prepare = file_utils._prepare_single_hop_path_and_storage_options  # every URL datasets resolves or downloads

    def prepare_standin(urlpath, *args, **kwargs):
        return (STANDINS[urlpath][0], {}) if urlpath in STANDINS else prepare(urlpath, *args, **kwargs)

    file_utils._prepare_single_hop_path_and_storage_options = prepare_standin


PATCHES = {"urllib.request": _patch_urllib, "requests.adapters": _patch_requests, "httpx": _patch_httpx,
           "datasets.utils.file_utils": _patch_datasets}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: hands the module's spec from the other finders, patched once the module has run."""

    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        for finder in sys.meta_path:
            spec = finder.find_spec(name, path, target) if finder is not self and hasattr(finder, "find_spec") else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            PATCHES[name](module)

        spec.loader.exec_module = exec_and_patch
        return spec


if STANDINS:
    for _name in [name for name in PATCHES if name in sys.modules]:  # imported before this file ran
        PATCHES[_name](sys.modules[_name])
    sys.meta_path.insert(0, _PatchOnImport())
