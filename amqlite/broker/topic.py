"""Topic routing: binding patterns in a word trie, with a per-key result cache.

Keys and patterns are dot-separated words; the empty string is zero words. In a
pattern ``*`` matches exactly one word and ``#`` zero or more. A key word that is
literally ``*`` or ``#`` is an ordinary word.

Publishing repeats a few routing keys many times, so results are cached per key.
The cache is bounded (cleared when full) and cleared on every add or remove, so a
cached answer is never stale.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)

CACHE_LIMIT = 4096


def split_words(key: str) -> list[str]:
    """The words of a key or pattern; ``""`` has none."""
    return key.split(".") if key else []


class _Node(Generic[T]):
    __slots__ = ("hash", "star", "values", "words")

    def __init__(self) -> None:
        self.words: dict[str, _Node[T]] = {}
        self.star: _Node[T] | None = None
        self.hash: _Node[T] | None = None
        self.values: dict[T, int] = {}

    def is_empty(self) -> bool:
        return not (self.words or self.star or self.hash or self.values)


class TopicMatcher(Generic[T]):
    """Maps topic patterns to values; ``match(key)`` gives every value bound by a
    pattern matching ``key``, each once, however many of its patterns match.

    A (pattern, value) pair may be added several times; it stays until removed as
    many times.
    """

    __slots__ = ("_cache", "_root")

    def __init__(self) -> None:
        self._root: _Node[T] = _Node()
        self._cache: dict[str, tuple[T, ...]] = {}

    def add(self, pattern: str, value: T) -> None:
        node = self._root
        for word in split_words(pattern):
            if word == "*":
                if node.star is None:
                    node.star = _Node()
                node = node.star
            elif word == "#":
                if node.hash is None:
                    node.hash = _Node()
                node = node.hash
            else:
                child = node.words.get(word)
                if child is None:
                    child = node.words[word] = _Node()
                node = child
        node.values[value] = node.values.get(value, 0) + 1
        self._cache.clear()

    def remove(self, pattern: str, value: T) -> bool:
        """Remove one (pattern, value) pair; False when it was not there."""
        path: list[tuple[_Node[T], str]] = []
        node: _Node[T] | None = self._root
        for word in split_words(pattern):
            assert node is not None
            path.append((node, word))
            if word == "*":
                node = node.star
            elif word == "#":
                node = node.hash
            else:
                node = node.words.get(word)
            if node is None:
                return False
        assert node is not None
        count = node.values.get(value)
        if count is None:
            return False
        if count > 1:
            node.values[value] = count - 1
        else:
            del node.values[value]
        self._prune(path, node)
        self._cache.clear()
        return True

    @staticmethod
    def _prune(path: list[tuple[_Node[T], str]], node: _Node[T]) -> None:
        for parent, word in reversed(path):
            if not node.is_empty():
                return
            if word == "*":
                parent.star = None
            elif word == "#":
                parent.hash = None
            else:
                del parent.words[word]
            node = parent

    def match(self, key: str) -> tuple[T, ...]:
        found = self._cache.get(key)
        if found is None:
            found = self._walk(split_words(key))
            if len(self._cache) >= CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = found
        return found

    def _walk(self, words: list[str]) -> tuple[T, ...]:
        n = len(words)
        out: dict[T, None] = {}
        seen: set[tuple[int, int]] = set()
        stack: list[tuple[_Node[T], int]] = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            h = node.hash
            if h is not None:
                for j in range(i, n + 1):
                    mark = (id(h), j)
                    if mark not in seen:
                        seen.add(mark)
                        stack.append((h, j))
            if i == n:
                for value in node.values:
                    out[value] = None
                continue
            child = node.words.get(words[i])
            if child is not None:
                stack.append((child, i + 1))
            if node.star is not None:
                stack.append((node.star, i + 1))
        return tuple(out)
