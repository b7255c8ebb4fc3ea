from sam.automaton import Matcher, SuffixAutomaton

__all__ = ["Matcher", "SuffixAutomaton"]
