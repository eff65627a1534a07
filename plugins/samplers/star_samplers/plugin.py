"""Hook implementation: registers the question samplers."""

from __future__ import annotations

from star_engine import hookimpl

from .samplers import AdaptiveSampler, CurriculumSampler, StratifiedSampler, UniformSampler

SAMPLERS = {
    "uniform": UniformSampler,
    "adaptive": AdaptiveSampler,
    "curriculum": CurriculumSampler,
    "stratified": StratifiedSampler,
}


@hookimpl
def register_samplers(register):
    for name, factory in SAMPLERS.items():
        register(name, factory)
