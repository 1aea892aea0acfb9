"""The `remote` manager against a small local HTTP scoring server that sometimes fails: 5xx and
refused connections are retried with backoff, 4xx is not, the total time is bounded, and every
final failure is a counted error."""

import asyncio
import collections
import http.server
import json
import socket
import threading

import pytest
from omegaconf import OmegaConf
from test_reward_loop import DigitTokenizer, make_batch

from verl.experimental.reward_loop import RewardLoopManager, RewardLoopWorker


class FlakyScorer(http.server.BaseHTTPRequestHandler):
    """Scores `solution_str == ground_truth`. The response "5" fails with 503 on its first two
    requests, "4" always answers 400, "3" answers a body that is not JSON; others answer at once."""

    requests = collections.Counter()
    lock = threading.Lock()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answer = body["solution_str"]
        with self.lock:
            self.requests[answer] += 1
            seen = self.requests[answer]
        if answer == "5" and seen <= 2:
            return self._send(503, b"busy")
        if answer == "4":
            return self._send(400, b"bad request")
        if answer == "3":
            return self._send(200, b"<html>")
        score = float(answer == body["ground_truth"])
        return self._send(200, json.dumps({"score": score, "source": body["data_source"]}).encode())

    def _send(self, code, payload):
        self.send_response(code)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):  # keep the test output clean
        pass


@pytest.fixture
def server():
    FlakyScorer.requests.clear()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FlakyScorer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/score"
    httpd.shutdown()
    httpd.server_close()


def remote_config(url, **kwargs):
    reward_kwargs = {"url": url, "backoff_s": 0.01, "max_backoff_s": 0.05, "error_score": -1.0, **kwargs}
    return OmegaConf.create(
        {"reward": {"num_workers": 1, "reward_manager": {"name": "remote"}, "reward_kwargs": reward_kwargs}}
    )


def score(cfg, responses, answers):
    worker = RewardLoopWorker(cfg, tokenizer=DigitTokenizer())
    return asyncio.run(worker.compute_score_batch(make_batch(responses, answers)))


def test_remote_scores_retry_5xx_and_never_retry_4xx(server, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    out = score(remote_config(server), ["7$", "5$", "4$", "3$", "8$"], ["7", "5", "4", "3", "1"])
    assert [o["reward_score"] for o in out] == [1.0, 1.0, -1.0, -1.0, 0.0]
    assert [o["reward_extra_info"]["score_error"] for o in out] == [False, False, True, True, False]
    assert [o["reward_extra_info"]["remote_attempts"] for o in out] == [1, 3, 1, 1, 1]
    assert FlakyScorer.requests["5"] == 3  # two 503s, then the answer
    assert FlakyScorer.requests["4"] == 1  # a client error is not retried
    assert out[0]["reward_extra_info"]["source"] == "toy"  # the answer's other entries


def test_remote_gives_up_after_max_retries_and_counts_the_error(server, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    (out,) = score(remote_config(server, max_retries=1), ["5$"], ["5"])
    assert out["reward_score"] == -1.0 and out["reward_extra_info"]["score_error"]
    assert out["reward_extra_info"]["remote_attempts"] == 2 and FlakyScorer.requests["5"] == 2


def test_refused_connections_are_retried_within_the_total_time_bound(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/score"
    (out,) = score(remote_config(url, max_retries=2), ["7$"], ["7"])
    assert out["reward_extra_info"]["score_error"] and out["reward_extra_info"]["remote_attempts"] == 3
    assert not out["reward_extra_info"]["score_timeout"]
    # many retries with long backoffs: the sample's total time bound (timeout) ends it, as a timeout
    cfg = remote_config(url, max_retries=1000, backoff_s=1.0, max_backoff_s=1.0, timeout=0.3)
    (out,) = score(cfg, ["7$"], ["7"])
    assert out["reward_extra_info"]["score_timeout"] and out["reward_score"] == -1.0


def test_remote_through_the_reward_loop_manager_and_its_config_checks(server, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    manager = RewardLoopManager(remote_config(server), tokenizer=DigitTokenizer(), backend="local")
    out = manager(make_batch(["7$", "8$"], ["7", "7"]), return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0]
    manager.close()
    with pytest.raises(ValueError, match=r"reward.reward_kwargs.url=None: the remote manager needs the http"):
        RewardLoopWorker(remote_config(None), tokenizer=DigitTokenizer())
    with pytest.raises(ValueError, match=r"reward.reward_kwargs has key\(s\) \['retries'\]"):
        RewardLoopWorker(remote_config(server, retries=3), tokenizer=DigitTokenizer())
