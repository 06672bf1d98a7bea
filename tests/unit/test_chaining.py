"""Operator chaining: Flink's rules, the chains' names and attributes, the submitted graph."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.examples_budget import examples

from tailguard.agent.executor.partitions import (
    read_completion,
    read_subpartitions,
    release_partition,
    subpartition_path,
    write_partition,
)
from tailguard.agent.executor.sinks import SinkDef, commit_sink_output, stage_sink_output
from tailguard.agent.executor.steps import OperatorStep
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import (
    Dataset,
    Exchanged,
    InputDef,
    Job,
    JobDefinitionError,
    pipelined_groups,
)
from tailguard.agent.graph.chaining import CHAIN_SEPARATOR, ChainDef, ChainedJob, chain
from tailguard.examples import orders_by_segment, sales_by_region
from tailguard.model.records import (
    Distribution,
    EdgeSpec,
    Exchange,
    JobGraphSpec,
    PartitionRef,
    VertexKind,
    VertexSpec,
)
from tailguard.model.topology import JobGraph


def f(t: pa.Table) -> pa.Table:
    return t


def g(t: pa.Table) -> pa.Table:
    return t


def both(a: pa.Table, b: pa.Table) -> pa.Table:
    return a


def names(chained: ChainedJob) -> list[str]:
    return list(chained.vertices)


def operators(chained: ChainedJob) -> list[tuple[str, ...]]:
    return [c.operators for c in chained.vertices.values()]


# ------------------------------------------------------------------------------------ rules


def test_forward_edges_of_equal_parallelism_are_chained() -> None:
    job = Job("j")
    src = job.read_parquet("in", name="src")
    src.map(f, name="a").map(g, name="b").write_parquet("out", name="out")
    chained = chain(job)
    assert operators(chained) == [("src", "a", "b", "out")]
    assert names(chained) == ["src→a→b→out"]


def test_fixed_equal_parallelism_is_chained() -> None:
    job = Job("j")
    src = job.read_parquet("in", name="src", parallelism=3)
    src.map(f, name="a", parallelism=3).write_parquet("out", name="out", parallelism=3)
    chained = chain(job)
    assert operators(chained) == [("src", "a", "out")]
    assert chained.vertices["src→a→out"].parallelism == 3


@pytest.mark.parametrize(
    "exchange",
    [
        lambda d: d.partition_by("k"),
        lambda d: d.rebalance(),
        lambda d: d.broadcast(),
    ],
    ids=["partition_by", "rebalance", "broadcast"],
)
def test_an_exchange_breaks_the_chain(exchange: Callable[[Dataset], Exchanged]) -> None:
    job = Job("j")
    a = job.read_parquet("in", name="src").map(f, name="a")
    exchange(a).map(g, name="b").map(f, name="c").write_parquet("out", name="out")
    chained = chain(job)
    assert operators(chained) == [("src", "a"), ("b", "c", "out")]
    (edge,) = chained.vertices["b→c→out"].inputs
    assert edge.producer == "src→a"
    assert edge.distribution is not Distribution.FORWARD


@pytest.mark.parametrize(
    ("upstream", "downstream"), [(None, 4), (4, None), (2, 4)], ids=["none-4", "4-none", "2-4"]
)
def test_a_parallelism_difference_breaks_the_chain(
    upstream: int | None, downstream: int | None
) -> None:
    job = Job("j")
    src = job.read_parquet("in", name="src", parallelism=upstream)
    mapped = src.map(f, name="a", parallelism=downstream)
    mapped.write_parquet("out", name="out", parallelism=downstream)
    assert operators(chain(job)) == [("src",), ("a", "out")]


def test_a_pipelined_edge_breaks_the_chain_and_stays_a_pipelined_chain_edge() -> None:
    job = Job("j")
    src = job.read_parquet("in", name="src", parallelism=2)
    a = src.map(f, name="a", parallelism=2)
    b = a.pipelined().map(g, name="b", parallelism=2)
    b.write_parquet("out", name="out", parallelism=2)
    chained = chain(job)
    assert operators(chained) == [("src", "a"), ("b", "out")]
    (edge,) = chained.vertices["b→out"].inputs
    assert (edge.producer, edge.exchange) == ("src→a", Exchange.PIPELINED)
    assert pipelined_groups(chained) == [("src→a", "b→out")]
    assert pipelined_groups(job) == [("a", "b")]


def test_fan_out_breaks_the_chain_after_the_shared_producer() -> None:
    job = Job("j")
    a = job.read_parquet("in", name="src").map(f, name="a")
    a.map(g, name="left").write_parquet("out1", name="out1")
    a.map(g, name="right").write_parquet("out2", name="out2")
    chained = chain(job)
    assert operators(chained) == [("src", "a"), ("left", "out1"), ("right", "out2")]
    for consumer in ("left→out1", "right→out2"):
        assert [i.producer for i in chained.vertices[consumer].inputs] == ["src→a"]


def test_a_join_heads_a_chain_and_its_consumer_joins_it() -> None:
    job = Job("j")
    left = job.read_parquet("l", name="left").map(f, name="lmap")
    right = job.read_csv("r", name="right")
    joined = job.combine([left.partition_by("k"), right.partition_by("k")], both, name="join")
    joined.map(g, name="after").write_parquet("out", name="out")
    chained = chain(job)
    assert operators(chained) == [("left", "lmap"), ("right",), ("join", "after", "out")]
    head = chained.vertices["join→after→out"]
    assert [(i.producer, i.keys) for i in head.inputs] == [("left→lmap", ("k",)), ("right", ("k",))]


def test_a_forward_join_input_still_breaks_the_chain() -> None:
    # Fan-in: the join has two inputs, even though one is FORWARD with the same parallelism.
    job = Job("j")
    left = job.read_parquet("l", name="left")
    right = job.read_csv("r", name="right")
    left.join(right.broadcast(), both, name="join").write_parquet("out", name="out")
    assert operators(chain(job)) == [("left",), ("right",), ("join", "out")]


def test_start_new_chain_breaks_before_the_vertex_but_not_after() -> None:
    job = Job("j")
    a = job.read_parquet("in", name="src").map(f, name="a")
    b = a.map(g, name="b").start_new_chain()
    b.map(f, name="c").write_parquet("out", name="out")
    assert operators(chain(job)) == [("src", "a"), ("b", "c", "out")]


def test_disable_chaining_isolates_the_vertex() -> None:
    job = Job("j")
    a = job.read_parquet("in", name="src").map(f, name="a")
    b = a.map(g, name="b").disable_chaining()
    b.map(f, name="c").write_parquet("out", name="out")
    assert operators(chain(job)) == [("src", "a"), ("b",), ("c", "out")]


def test_chaining_disabled_for_the_job_gives_one_chain_per_operator() -> None:
    job = Job("j")
    job.read_parquet("in", name="src").map(f, name="a").write_parquet("out", name="out")
    chained = chain(job, enabled=False)
    assert operators(chained) == [("src",), ("a",), ("out",)]
    assert chained.spec() == JobGraphSpec(
        vertices=tuple(
            VertexSpec(v.name, v.kind, v.parallelism, operators=(v.name,))
            for v in job.vertices.values()
        ),
        edges=tuple(
            EdgeSpec(i.producer, v.name, i.distribution, i.exchange, index)
            for v in job.vertices.values()
            for index, i in enumerate(v.inputs)
        ),
    )


def test_a_sink_ends_its_chain_even_with_a_consumer() -> None:
    job = Job("j")
    written = job.read_parquet("in", name="src").write_parquet("out", name="out")
    written.map(f, name="after").write_parquet("out2", name="out2")
    assert operators(chain(job)) == [("src", "out"), ("after", "out2")]


def test_two_pipelined_groups_are_not_merged_by_chaining() -> None:
    # x =pipelined=> a -> b =pipelined=> y: chaining a and b would make one region of all four.
    job = Job("j")
    x = job.read_parquet("in", name="x", parallelism=2)
    a = x.pipelined().map(f, name="a", parallelism=2)
    b = a.map(g, name="b", parallelism=2)
    b.pipelined().map(f, name="y", parallelism=2).write_parquet("out", name="out", parallelism=2)
    chained = chain(job)
    assert operators(chained) == [("x",), ("a",), ("b",), ("y", "out")]
    assert pipelined_groups(chained) == [("x", "a"), ("b", "y→out")]


def test_chain_validates_the_job_first() -> None:
    job = Job("j")
    job.read_parquet("in", name="src").map(f, name="a")
    with pytest.raises(JobDefinitionError, match="no consumer"):
        chain(job)


def test_user_names_cannot_contain_the_chain_separator() -> None:
    job = Job("j")
    with pytest.raises(JobDefinitionError):
        job.read_parquet("in", name="src").map(f, name=f"a{CHAIN_SEPARATOR}b")


# ------------------------------------------------------------------------------------ chains


def test_names_join_operators_with_a_right_arrow() -> None:
    assert CHAIN_SEPARATOR == "\u2192"
    job = sales_by_region.make_job("in", "out")
    chained = chain(job)
    for c in chained.vertices.values():
        assert c.name == "\u2192".join(c.operators)
        for op in c.operators:
            assert chained.chain_of(op) == c.name
    with pytest.raises(KeyError):
        chained.chain_of("nope")


def test_a_single_operator_chain_keeps_the_operator_name() -> None:
    chained = chain(orders_by_segment.make_job("o", "c", "out"))
    assert chained.vertices["enrich"].operators == ("enrich",)
    assert chained.chain_of("enrich") == "enrich"


def test_sales_example_runs_as_two_chains() -> None:
    chained = chain(sales_by_region.make_job("in", "out"))
    assert chained.name == "sales-by-region"
    assert names(chained) == ["sales→score→partial", "final→sink"]
    head, tail = chained.vertices.values()
    assert head.kind is VertexKind.SOURCE and head.source is not None and head.sink is None
    assert [s.name for s in head.steps] == ["score", "partial"]
    assert tail.kind is VertexKind.SINK and tail.sink is not None and tail.source is None
    assert [s.name for s in tail.steps] == ["final"]
    assert tail.steps[0].style == "aggregate" and tail.steps[0].keys == ("region",)
    (edge,) = tail.inputs
    assert edge == InputDef("sales→score→partial", Distribution.ALL_TO_ALL, ("region",))


def test_orders_example_chains() -> None:
    chained = chain(orders_by_segment.make_job("o", "c", "out"))
    assert names(chained) == ["orders", "customers", "enrich", "final→sink"]
    kinds = [c.kind for c in chained.vertices.values()]
    assert kinds == [VertexKind.SOURCE, VertexKind.SOURCE, VertexKind.OPERATOR, VertexKind.SINK]
    enrich = chained.vertices["enrich"]
    assert [(i.producer, i.distribution) for i in enrich.inputs] == [
        ("orders", Distribution.FORWARD),
        ("customers", Distribution.BROADCAST),
    ]
    assert enrich.steps == (OperatorStep("enrich", orders_by_segment.enrich, "arrow"),)


def test_kinds_of_a_chain() -> None:
    job = Job("j")
    src = job.read_parquet("in", name="src")
    a = src.map(f, name="a", parallelism=2)
    b = a.map(g, name="b", parallelism=2).disable_chaining()
    b.map(f, name="c", parallelism=2).write_parquet("out", name="out", parallelism=2)
    kinds = {c.name: c.kind for c in chain(job).vertices.values()}
    assert kinds == {
        "src": VertexKind.SOURCE,
        "a": VertexKind.OPERATOR,
        "b": VertexKind.OPERATOR,
        "c→out": VertexKind.SINK,
    }


def test_a_chain_from_source_to_sink_is_a_source_with_a_sink() -> None:
    job = Job("j")
    job.read_parquet("in", name="src").map(f, name="a").write_parquet("out", name="out")
    (only,) = chain(job).vertices.values()
    assert only.kind is VertexKind.SOURCE
    assert only.source == job.vertices["src"].source
    assert only.sink == SinkDef("parquet", "out")
    assert (only.head, only.tail) == ("src", "out")


def test_steps_list_the_members_with_a_function_in_order_with_their_style() -> None:
    job = Job("j")
    src = job.read_parquet("in", name="src")
    src.map(f, name="a").map_pandas(g, name="b").write_parquet("out", name="out")
    (only,) = chain(job).vertices.values()
    assert only.steps == (OperatorStep("a", f, "arrow"), OperatorStep("b", g, "pandas"))


def test_speculation_safety_and_max_parallelism_fold_over_members() -> None:
    job = Job("j")
    src = job.read_parquet("in", name="src")
    a = src.map(f, name="a", max_parallelism=64)
    b = a.map(g, name="b", max_parallelism=16).speculation_unsafe()
    b.partition_by("k").map(f, name="c").write_parquet("out", name="out", max_parallelism=32)
    chained = chain(job)
    first, second = chained.vertices.values()
    assert (first.max_parallelism, first.speculation_safe) == (16, False)
    assert (second.max_parallelism, second.speculation_safe) == (32, True)
    job2 = Job("j2")
    job2.read_parquet("in", name="src").map(f, name="a").write_parquet("out", name="out")
    (only,) = chain(job2).vertices.values()
    assert (only.max_parallelism, only.speculation_safe) == (None, True)


def test_chain_defs_have_the_vertex_def_attributes_the_driver_reads() -> None:
    job = sales_by_region.make_job("in", "out")
    chained = chain(job)
    for name in ("name", "kind", "inputs", "parallelism", "max_parallelism", "speculation_safe"):
        for attribute in (name, "source", "sink"):
            assert hasattr(job.vertices["sales"], attribute)
            assert hasattr(chained.vertices["sales→score→partial"], attribute)
    assert isinstance(chained.vertices["final→sink"], ChainDef)


# ------------------------------------------------------------------------------------ spec


def test_spec_has_one_vertex_per_chain_with_its_operators_and_chain_edges() -> None:
    chained = chain(orders_by_segment.make_job("o", "c", "out"))
    spec = chained.spec({"orders": (10, 20), "customers": (5,)})
    assert [(v.name, v.kind, v.operators, v.split_bytes) for v in spec.vertices] == [
        ("orders", VertexKind.SOURCE, ("orders",), (10, 20)),
        ("customers", VertexKind.SOURCE, ("customers",), (5,)),
        ("enrich", VertexKind.OPERATOR, ("enrich",), ()),
        ("final→sink", VertexKind.SINK, ("final", "sink"), ()),
    ]
    assert spec.edges == (
        EdgeSpec("orders", "enrich", Distribution.FORWARD, Exchange.BLOCKING, 0),
        EdgeSpec("customers", "enrich", Distribution.BROADCAST, Exchange.BLOCKING, 1),
        EdgeSpec("enrich", "final→sink", Distribution.ALL_TO_ALL, Exchange.BLOCKING, 0),
    )
    graph = JobGraph(spec)
    assert graph.consumers("enrich") == ("final→sink",)


def test_spec_split_bytes_by_chain_name_or_by_its_source_operator() -> None:
    chained = chain(sales_by_region.make_job("in", "out"))
    by_chain = chained.spec({"sales→score→partial": (1, 2)})
    by_source = chained.spec({"sales": (1, 2)})
    assert by_chain == by_source
    assert by_chain.vertices[0].split_bytes == (1, 2)
    assert by_chain.vertices[0].operators == ("sales", "score", "partial")
    assert chained.spec().vertices[0].split_bytes == ()


# ------------------------------------------------------------------------------------ property


_EXCHANGES: dict[str, Callable[[Dataset], Exchanged]] = {
    "forward": lambda d: Exchanged(d, Distribution.FORWARD),
    "partition_by": lambda d: d.partition_by("k"),
    "rebalance": lambda d: d.rebalance(),
}


@settings(max_examples=examples(60), deadline=None)
@given(
    links=st.lists(
        st.tuples(
            st.sampled_from(sorted(_EXCHANGES)), st.sampled_from([None, 2, 3]), st.booleans()
        ),
        min_size=1,
        max_size=6,
    ),
    source_parallelism=st.sampled_from([None, 2, 3]),
)
def test_a_line_of_operators_breaks_exactly_at_the_rules(
    links: list[tuple[str, int | None, bool]], source_parallelism: int | None
) -> None:
    job = Job("line")
    current = job.read_parquet("in", name="op0", parallelism=source_parallelism)
    expected: list[list[str]] = [["op0"]]
    previous = source_parallelism
    for n, (exchange, parallelism, new_chain) in enumerate(links, start=1):
        current = _EXCHANGES[exchange](current).map(f, name=f"op{n}", parallelism=parallelism)
        if new_chain:
            current = current.start_new_chain()
        if exchange == "forward" and parallelism == previous and not new_chain:
            expected[-1].append(f"op{n}")
        else:
            expected.append([f"op{n}"])
        previous = parallelism
    current.write_parquet("out", name="out", parallelism=previous)
    expected[-1].append("out")

    chained = chain(job)
    assert operators(chained) == [tuple(e) for e in expected]
    for before, after in itertools.pairwise(expected):
        (edge,) = chained.vertices["→".join(after)].inputs
        assert edge.producer == "→".join(before)
    spec = chained.spec()
    assert len(spec.edges) == len(expected) - 1
    JobGraph(spec)


# ------------------------------------------------------------------------------------ storage


@pytest.fixture(params=["local", "pyarrow-mock"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return Storage(str(tmp_path))
    # pyarrow's in-memory filesystem: the code path of HDFS and S3 (paths inside a
    # FileSystem), not the local one.
    return Storage(f"mock:///{uuid.uuid4().hex}")


def test_a_partition_of_a_chain_is_written_and_read_by_its_arrowed_name(
    storage: Storage, tmp_path: Path
) -> None:
    ref = PartitionRef("a→b", 1, 0)
    tables = [pa.table({"k": [1, 2]}), pa.table({"k": [3]})]
    written = write_partition(storage, "job-1", ref, tables)
    path = subpartition_path(storage, "job-1", ref, 1)
    assert "/partitions/a→b/1/0/1.arrow" in path
    assert storage.exists(path)
    if "://" not in storage.uri:
        assert (tmp_path / "job-1" / "partitions" / "a→b" / "1" / "0" / "1.arrow").is_file()
    assert read_completion(storage, "job-1", ref) == written
    checksums = {(1, sp): c for sp, c in enumerate(written.checksums)}
    table, read = read_subpartitions(storage, "job-1", "a→b", {1: 0}, (1, 1), (0, 1), checksums)
    assert table.column("k").to_pylist() == [1, 2, 3]
    assert read == sum(written.bytes_per_subpartition)
    release_partition(storage, "job-1", ref)
    assert not storage.exists(path)


def test_a_sink_chain_stages_and_commits_under_its_arrowed_name(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path / "storage"))
    staged = stage_sink_output(storage, "job-1", "final→sink", 0, 1, pa.table({"k": [1]}))
    assert "final→sink" in staged.path
    published = commit_sink_output(storage, staged, str(tmp_path / "out"))
    assert Path(published).is_file()
