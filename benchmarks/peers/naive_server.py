"""The naive deployment for benchmarks/peers.py: FastAPI + ``transformers.pipeline``, one
request, one pipeline call. Run inside its own virtual environment (naive.txt)::

    python naive_server.py MODEL_FOLDER PORT THREADS

``POST /predict`` takes ``{"text": "..."}`` and answers the pipeline's ``{"label", "score"}``.
"""

from __future__ import annotations

import sys

import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from transformers import pipeline

folder, port, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
classify = pipeline("text-classification", model=folder, device="cpu")
app = FastAPI()


class Record(BaseModel):
    text: str


@app.post("/predict")
def predict(record: Record) -> dict:
    return classify(record.text, truncation=True, max_length=128)[0]


@app.get("/healthz")
def healthz() -> dict:
    return {"ok": True}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
