p = "tests/test_gitattributes.py"
s = open(p).read()
old = '''    model, vocab = load_course_gpt()
    assert model.config.vocab_size == len(vocab)
'''
new = '''    model, vocab = load_course_gpt()
    assert model.config.vocab_size == len(vocab)
    from helpers.lm import load_training_log

    assert load_training_log(clone / "data")["checkpoint_sha256"] == listed["gpt_shakespeare.pt"]
'''
if "load_training_log" not in s:
    assert old in s
    s = s.replace(old, new)
    s = s.replace('{"shakespeare.txt", "dates_train.tsv", "minilm_reference.json", "gpt_shakespeare.pt"}',
                  '{"shakespeare.txt", "dates_train.tsv", "minilm_reference.json", "gpt_shakespeare.pt",\n'
                  '            "gpt_shakespeare_log.json"}')
    open(p, "w").write(s)
    print("test_gitattributes: the log is loaded too")
