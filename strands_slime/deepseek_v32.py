from strands_slime._compat import moved_module

moved_module(__name__, "strands_slime.provider.deepseek")
